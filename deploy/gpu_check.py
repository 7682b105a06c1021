"""`make gpu-check`'s device step: does this venv's edgeserve offload the model to a GPU?

`python deploy/gpu_check.py --model M --edgeserve .venv/bin/edgeserve` prints what `nvidia-smi`
sees, serves M with the defaults (every layer offloaded), reads /health and times one greedy
answer. It exits 0 when /health reports the offload, and 1 with the server's own CUDA log lines
when it does not (a machine without a GPU or driver: `make gpu-check` stops there, before the
llama-server build and the bench). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

PROMPT = "Count from one to twenty in words, separated by commas."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gpus() -> str:
    """What `nvidia-smi -L` lists, or why nothing is listed."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "nvidia-smi: not found (no NVIDIA driver here)"
    done = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).strip() or f"nvidia-smi exited {done.returncode}"


def _get_json(url: str, body: dict | None = None, timeout: float = 5) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def wait_ready(proc: subprocess.Popen, base: str, timeout: float) -> dict:
    """/health's body once it answers 200; raises when the server exits or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"edgeserve exited {proc.returncode} before it was ready")
        try:
            status, body = _get_json(f"{base}/health", timeout=1)
            if status == 200:
                return body
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"edgeserve was not ready within {timeout:g}s")


def timed_answer(base: str, tokens: int) -> str:
    """One greedy answer of up to `tokens` tokens, as a line with its speed."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
            "temperature": 0}  # fmt: skip
    started = time.monotonic()
    status, answer = _get_json(f"{base}/v1/chat/completions", body, timeout=120)
    elapsed = time.monotonic() - started
    if status != 200:
        raise RuntimeError(f"chat completion answered {status}: {answer}")
    generated = answer["usage"]["completion_tokens"]
    return (
        f"{generated} tokens in {elapsed:.2f}s ({generated / elapsed:.1f} tok/s, prefill included)"
    )


def check(edgeserve: Path, model: Path, timeout: float) -> int:
    """Serve `model`, report the offload; 0 when /health says the layers are on a GPU."""
    print(f"gpu-check: {gpus()}", flush=True)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [str(edgeserve), "serve", "--model", str(model), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            health = wait_ready(proc, base, timeout)
            summary = {k: health.get(k) for k in ("gpu_offload", "n_gpu_layers", "flash_attn")}
            print(f"gpu-check: /health {json.dumps(summary)}", flush=True)
            if health.get("gpu_offload"):
                print(f"gpu-check: {timed_answer(base, 128)}", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            log.seek(0)
            said = [line.rstrip() for line in log if "cuda" in line.lower()]
    if health.get("gpu_offload"):
        return 0
    lines = "\n  ".join(said or ["(nothing about CUDA)"])
    print(f"gpu-check: no layer is offloaded; the checks that need a GPU stop here. edgeserve "
          f"said:\n  {lines}", file=sys.stderr)  # fmt: skip
    return 1


def main() -> None:
    """Command line: see the module's docstring."""
    parser = argparse.ArgumentParser(prog="deploy/gpu_check.py", description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--edgeserve", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for /health")
    args = parser.parse_args()
    raise SystemExit(check(args.edgeserve, args.model, args.timeout))


if __name__ == "__main__":
    main()
