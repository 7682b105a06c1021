"""The systemd unit, its environment file and `make install-systemd` (no model, no root)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from edgeserve import config
from edgeserve.config import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "edgeserve.service"
ENV_EXAMPLE = REPO / "systemd" / "edgeserve.env"
ENV_LINE = re.compile(r"^#?([A-Z][A-Z0-9_]*)=(.*)$")
UNLOAD_MARGIN_S = 10


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections → key → every value (keys such as DeviceAllow repeat); comments skipped."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def env_example(*, commented: bool) -> dict[str, str]:
    """NAME=value lines of the example; with `commented`, the `#NAME=value` ones too."""
    found = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = ENV_LINE.match(line)
        if match and (commented or not line.startswith("#")):
            found[match.group(1)] = match.group(2)
    return found


def run_make(*args: str) -> subprocess.CompletedProcess[str]:
    """`make` in the repository, isolated from an enclosing make's flags and variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


SERVICE = parse_unit(UNIT.read_text())["Service"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("Restart", "on-failure"),
        ("RestartPreventExitStatus", "2"),
        ("User", "edgeserve"),
        ("EnvironmentFile", "-/etc/edgeserve/edgeserve.env"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "true"),
        ("PrivateTmp", "true"),
        ("NoNewPrivileges", "true"),
        ("ReadOnlyPaths", "-/opt/edgeserve/models"),
        ("DevicePolicy", "closed"),
        ("DeviceAllow", "char-nvidia* rw"),
        ("DeviceAllow", "char-nvhost* rw"),
    ],
)
def test_unit_has(key, value):
    assert value in SERVICE.get(key, []), f"{key}={value} missing from {UNIT.name}"


def test_unit_leaves_the_gpu_visible_and_mlock_optional():
    assert "PrivateDevices" not in SERVICE  # it would hide /dev/nvidia*
    assert "LimitMEMLOCK" not in SERVICE
    assert "#LimitMEMLOCK=infinity" in UNIT.read_text().splitlines()


def test_watchdog_is_on():
    (watchdog,) = SERVICE["WatchdogSec"]
    assert int(watchdog) >= 10


def test_stop_timeout_covers_two_drains_and_the_unload():
    """aiohttp may spend the drain timeout twice (wait, then cancel); then the model is freed."""
    (stop,) = SERVICE["TimeoutStopSec"]
    drain = float(
        env_example(commented=False).get(
            "EDGESERVE_DRAIN_TIMEOUT_S", Settings.__dataclass_fields__["drain_timeout_s"].default
        )
    )
    assert int(stop) > 2 * drain + UNLOAD_MARGIN_S


def test_env_example_names_only_real_settings():
    known = {name for opt in config.OPTIONS for name in opt.env}
    names = set(env_example(commented=True))
    assert names, "no NAME=value lines found"
    assert names <= known, f"unknown settings in {ENV_EXAMPLE.name}: {sorted(names - known)}"


def test_env_example_binds_every_interface():
    assert env_example(commented=False)["API_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("commented", [False, True], ids=["as-shipped", "all-uncommented"])
def test_env_example_values_load(tmp_path, commented):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    keys = tmp_path / "keys"
    keys.write_text("k1\n")
    environ = env_example(commented=commented)
    environ.pop("EDGESERVE_MODEL", None)
    if "EDGESERVE_API_KEY_FILE" in environ:
        environ["EDGESERVE_API_KEY_FILE"] = str(keys)
    if "EDGESERVE_MMPROJ" in environ:
        environ["EDGESERVE_MMPROJ"] = str(model)  # a file that exists stands for the projector
    if "EDGESERVE_LORA_DIR" in environ:
        environ["EDGESERVE_LORA_DIR"] = str(tmp_path)  # a folder that exists
    if "EDGESERVE_MODELS_DIR" in environ:
        environ["EDGESERVE_MODELS_DIR"] = str(tmp_path)  # the catalogue's folder
    settings = load_settings(["--model", str(model)], environ)
    assert settings.host == "0.0.0.0"
    assert settings.log_format == "json"


def test_install_systemd_into_destdir(tmp_path):
    dest = tmp_path / "root"
    done = run_make("install-systemd", f"DESTDIR={dest}", "PREFIX=/usr", "APP_DIR=/srv/edge")
    assert done.returncode == 0, done.stderr
    unit = dest / "usr/lib/systemd/system/edgeserve.service"
    env = dest / "etc/edgeserve/edgeserve.env"
    text = unit.read_text()
    assert f"ExecStart={REPO}/.venv/bin/edgeserve serve" in text
    assert "ReadOnlyPaths=-/srv/edge/models" in text
    assert "/opt/edgeserve" not in text + env.read_text()
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    # A second install keeps the operator's settings.
    env.write_text("API_PORT=9000\n")
    assert run_make("install-systemd", f"DESTDIR={dest}", "PREFIX=/usr").returncode == 0
    assert env.read_text() == "API_PORT=9000\n"


def test_user_and_reload_only_without_destdir(tmp_path):
    staged = run_make("-n", "install-systemd", f"DESTDIR={tmp_path}")
    live = run_make("-n", "install-systemd")
    assert staged.returncode == 0 and live.returncode == 0
    assert "useradd" not in staged.stdout and "daemon-reload" not in staged.stdout
    assert "useradd --system" in live.stdout and "daemon-reload" in live.stdout
    assert "usermod -a -G video edgeserve" in live.stdout


def test_install_systemd_warns_about_home(tmp_path):
    done = run_make("install-systemd", f"DESTDIR={tmp_path}", "APP_DIR=/home/me/edgeserve")
    assert done.returncode == 0
    assert "ProtectHome" in done.stderr


needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (Debian/Ubuntu: apt-get install systemd)",
)


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )


@needs_analyze
def test_installed_unit_passes_systemd_analyze_verify(tmp_path):
    assert run_make("install-systemd", f"DESTDIR={tmp_path}").returncode == 0
    (unit,) = tmp_path.glob("**/edgeserve.service")
    done = verify(unit)
    # verify exits 0 on settings it ignores, so any complaint at all fails the test.
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stderr


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path):
    """The check above can fail: a typo in a setting is reported."""
    assert run_make("install-systemd", f"DESTDIR={tmp_path}").returncode == 0
    (unit,) = tmp_path.glob("**/edgeserve.service")
    unit.write_text(unit.read_text().replace("WatchdogSec=30", "WatchdogSec=thirty"))
    done = verify(unit)
    assert "WatchdogSec" in done.stdout + done.stderr or "thirty" in done.stdout + done.stderr


# ---- llama-cpp-python builds per backend ------------------------------------------------------


def dry_run(tmp_path: Path, *args: str) -> str:
    """What `make -n` would run, with a scratch venv and wheel cache."""
    done = run_make("-n", *args, f"VENV={tmp_path}/venv", f"WHEEL_CACHE={tmp_path}/wheels")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_install_cuda_builds_with_cuda_for_the_given_arch(tmp_path):
    out = dry_run(tmp_path, "install-cuda", "CUDA_ARCH=87")
    cuda = "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=87"
    # deploy/cuda.py's compiler, cuBLAS and driver arguments follow the backend's own.
    assert "found=$(" in out and "deploy/cuda.py cmake-args" in out
    assert f'CMAKE_ARGS="-DLLAVA_BUILD=ON -DMTMD_VIDEO=OFF {cuda} $(echo $found)"' in out
    assert "--no-binary llama-cpp-python" in out
    assert f"{tmp_path}/wheels/cuda-" in out


def test_install_metal_builds_with_metal(tmp_path):
    out = dry_run(tmp_path, "install-metal")
    assert 'CMAKE_ARGS="-DLLAVA_BUILD=ON -DMTMD_VIDEO=OFF -DGGML_METAL=ON"' in out
    assert "deploy/cuda.py" not in out


def test_the_chosen_backend_is_kept_by_later_targets(tmp_path):
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / ".backend.mk").write_text("BACKEND ?= cuda\nCUDA_ARCH ?= 87\n")
    assert "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=87" in dry_run(tmp_path, "install")
    assert "-DGGML_NATIVE=ON" in dry_run(tmp_path, "install", "BACKEND=cpu")
