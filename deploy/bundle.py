"""Build the self-contained bundle (`make dist`) and measure it.

`python deploy/bundle.py build` runs PyInstaller on deploy/edgeserve.spec into dist/edgeserve/,
unless the bundle there was built from the same sources and installed packages (a key in
dist/.edgeserve-bundle-key). `python deploy/bundle.py report --model M` prints the bundle's size
and its start-to-ready time (process start until /health answers 200, from an empty
environment) next to the venv's `edgeserve`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "deploy" / "edgeserve.spec"
DIST = REPO / "dist"
BUNDLE = DIST / "edgeserve"
EXECUTABLE = BUNDLE / "edgeserve"
KEY_FILE = DIST / ".edgeserve-bundle-key"
WORK = REPO / "build" / "pyinstaller"
EMPTY_ENV = {"PATH": "/usr/bin:/bin"}


def _llama_lib() -> Path:
    """llama-cpp-python's shared libraries in this venv (without importing llama.cpp)."""
    dist = importlib.metadata.distribution("llama-cpp-python")
    return Path(str(dist.locate_file("llama_cpp"))) / "lib"


def build_key() -> str:
    """A hash of what the bundle is made of: edgeserve's files (sources and the chat page), the
    spec and this script, the installed packages, the llama.cpp libraries (the backend) and the
    Python build."""
    digest = hashlib.sha256(f"{sys.version}|{platform.machine()}".encode())
    package = [p for p in (REPO / "edgeserve").rglob("*") if p.is_file() and p.suffix != ".pyc"]
    sources = sorted(package) + sorted((REPO / "deploy").glob("*.py"))
    for path in [SPEC, *sources]:
        digest.update(f"{path.relative_to(REPO)}\0".encode() + path.read_bytes())
    packages = sorted(
        f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
    )
    digest.update("\n".join(packages).encode())
    for lib in sorted(_llama_lib().iterdir()):
        digest.update(f"{lib.name}:{lib.stat().st_size}:{lib.stat().st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def build() -> Path:
    """Build dist/edgeserve/ unless an up-to-date one is there; the executable's path."""
    key = build_key()
    if EXECUTABLE.is_file() and KEY_FILE.is_file() and KEY_FILE.read_text().strip() == key:
        print(f"{BUNDLE} is up to date (key {key})")
        return EXECUTABLE
    KEY_FILE.unlink(missing_ok=True)
    command = [
        *(sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN"),
        *("--distpath", str(DIST), "--workpath", str(WORK), str(SPEC)),
    ]
    print(f"building {BUNDLE} with PyInstaller (a minute or two)", flush=True)
    subprocess.run(command, cwd=REPO, check=True)
    KEY_FILE.write_text(key + "\n")
    return EXECUTABLE


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_to_ready(executable: Path, model: Path, timeout: float = 120) -> float:
    """Seconds from starting `executable serve` in an empty environment to /health's 200."""
    port = _free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(executable), "serve", "--model", str(model), "--port", str(port)],
        env=EMPTY_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while time.monotonic() - started < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"{executable} exited {proc.returncode}: {proc.stderr.read()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.01)
        raise TimeoutError(f"{executable} was not ready within {timeout:g}s")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def report(model: Path, runs: int) -> None:
    """Print the bundle's size, its largest parts and start-to-ready times beside the venv's."""
    size = subprocess.run(["du", "-sh", str(BUNDLE)], capture_output=True, text=True, check=True)
    print(f"bundle: {size.stdout.split()[0]} in {BUNDLE.relative_to(REPO)}/")
    parts = subprocess.run(
        ["du", "-s", "--block-size=1M", *map(str, sorted((BUNDLE / "_internal").iterdir()))],
        capture_output=True,
        text=True,
        check=True,
    )
    largest = sorted(
        (line.split("\t") for line in parts.stdout.splitlines()), key=lambda r: -int(r[0])
    )
    print("largest parts: " + ", ".join(f"{Path(p).name} {mb} MB" for mb, p in largest[:6]))
    venv_exe = Path(sys.executable).parent / "edgeserve"
    for exe in (EXECUTABLE, venv_exe):
        times = [start_to_ready(exe, model) for _ in range(runs)]
        shown = exe.relative_to(REPO) if exe.is_relative_to(REPO) else exe
        print(
            f"start to ready ({shown}): "
            f"{statistics.median(times):.2f}s median of {runs} "
            f"({', '.join(f'{t:.2f}' for t in times)})"
        )
    print(
        f"run it anywhere (no Python needed): copy {BUNDLE.relative_to(REPO)}/ over, then\n"
        f"  {BUNDLE.relative_to(REPO)}/edgeserve serve --model /path/to/model.gguf\n"
        "as a systemd service from this checkout: sudo make install-systemd BUNDLE=1"
    )


def main() -> None:
    """`build` or `report`."""
    parser = argparse.ArgumentParser(prog="deploy/bundle.py", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build dist/edgeserve/ unless it is up to date")
    measure = commands.add_parser("report", help="size and start-to-ready times")
    measure.add_argument("--model", type=Path, required=True)
    measure.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.command == "build":
        build()
    else:
        report(args.model.resolve(), args.runs)


if __name__ == "__main__":
    os.chdir(REPO)
    main()
