"""The CUDA build of llama-cpp-python (`make install-cuda`), started on a machine with no GPU.

Runs only when that wheel is in the wheel cache (it skips, saying so, otherwise) and only from
`make test-cuda`: it installs the wheel and edgeserve into a venv of its own (a minute or two,
outside `make test`'s budget). In order:
1. a CUDA library that does not load (a damaged `libcublas.so.13` beside llama.cpp's own, where
   the loader looks first, and no cuBLAS wheel yet) makes `edgeserve serve` exit 2 with one
   line naming it;
2. with the runtime wheels the build needs (WHEELS/requirements.txt, as `make install` adds
   them), it serves on the CPU: one warning that no CUDA device was found, `/health` reports
   no offload, and the greedy answer is the CPU build's, word for word.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.test_server_process import free_port

REPO = Path(__file__).resolve().parents[2]
WHEEL_CACHE = Path(os.environ.get("WHEEL_CACHE", Path.home() / ".cache/edgeserve/wheels"))
QUESTION = {
    "model": "m",
    "messages": [{"role": "user", "content": "Name three colours."}],
    "max_tokens": 24,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def cuda_wheel() -> Path:
    """The newest CUDA wheel `make install-cuda` left in the wheel cache."""
    wheels = sorted(
        WHEEL_CACHE.glob("cuda-*/llama_cpp_python-*.whl"), key=lambda p: p.stat().st_mtime
    )
    if not wheels:
        pytest.skip(f"no CUDA wheel in {WHEEL_CACHE}/cuda-*: run `make install-cuda` first")
    return wheels[-1]


def pip(venv: Path, *args: str) -> None:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def serve(venv: Path, model: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESERVE_", "API_"))}
    return subprocess.Popen(
        [str(venv / "bin" / "edgeserve"), "serve", "--model", str(model), "--port", str(port),
         "--threads", "2", "--ctx-size", "1024", "--parallel", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip


def get(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def health_when_ready(proc: subprocess.Popen[str], url: str) -> dict:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            status, body = get(f"{url}/health")
            if status == 200:
                return body
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.1)
    raise TimeoutError("the CUDA build's server was not ready")


def answer(url: str) -> str:
    status, body = get(f"{url}/v1/chat/completions", QUESTION)
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


def test_a_cuda_build_on_a_machine_without_a_gpu(cuda_wheel, model_path, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip(venv, "--no-deps", str(cuda_wheel))
    pip(venv, "-e", str(REPO))
    site = next((venv / "lib").glob("python3*/site-packages"))
    damaged = site / "llama_cpp" / "lib" / "libcublas.so.13"
    damaged.write_text("not a library")
    broken = subprocess.run(
        [str(venv / "bin" / "edgeserve"), "serve", "--model", str(model_path),
         "--port", str(free_port())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    damaged.unlink()
    lines = broken.stderr.strip().splitlines()
    assert broken.returncode == 2, broken.stderr[-3000:]
    assert len(lines) == 1, broken.stderr
    assert lines[0].startswith("edgeserve: error: llama.cpp does not load: ")
    assert "libcublas.so.13" in lines[0], lines[0]
    requirements = cuda_wheel.parent / "requirements.txt"
    if requirements.is_file() and requirements.read_text().strip():
        pip(venv, "-r", str(requirements))

    cpu_port, cuda_port = free_port(), free_port()
    cpu = serve(Path(sys.executable).parent.parent, model_path, cpu_port)
    cuda = serve(venv, model_path, cuda_port)
    try:
        health = health_when_ready(cuda, f"http://127.0.0.1:{cuda_port}")
        assert (health["gpu_offload"], health["n_gpu_layers"]) == (False, 0)
        health_when_ready(cpu, f"http://127.0.0.1:{cpu_port}")
        assert answer(f"http://127.0.0.1:{cuda_port}") == answer(f"http://127.0.0.1:{cpu_port}")
    finally:
        for proc in (cpu, cuda):
            proc.terminate()
        _, err = cuda.communicate(timeout=60)
        cpu.communicate(timeout=60)
    said = [line for line in err.splitlines() if "cuda" in line.lower()]
    assert len(said) == 1, err[-3000:]
    assert "no CUDA device found" in said[0] and "serving on the CPU" in said[0]
    assert cuda.returncode == 0, err[-3000:]
