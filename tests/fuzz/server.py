"""A real `edgeserve serve` process for the HTTP fuzzing (run offline: offline_server.py), and
the checks made after each request: the process is alive, and its log (JSON lines, read from a
file) holds no traceback, no unhandled error and no access line with a 5xx status or a stream
that ended with one."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.memory import limit_address_space
from tests.integration.test_server_process import free_port

REPO = Path(__file__).resolve().parents[2]
SERVER_MEMORY_BYTES = 8 << 30
"""The server's address-space limit (tests/fuzz/memory.py; it maps about 1.2 GB)."""
REQUEST_TIMEOUT_S = 120
"""A request unanswered this long is a hung connection (the longest legitimate answer, a
generation that fills the context, takes a few seconds)."""


@dataclass(frozen=True)
class Answer:
    """A response: the status, the headers that matter, and the whole body."""

    status: int
    content_type: str
    body: bytes


class FuzzServer:
    """The server process on a free port, its log in `log_path`."""

    def __init__(self, model: Path, log_path: Path, *args: str) -> None:
        self.port = free_port()
        self.log_path = log_path
        self._log_offset = 0
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESERVE_", "API_"))}
        with log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.fuzz.offline_server",
                    "serve",
                    "--model",
                    str(model),
                    "--port",
                    str(self.port),
                    "--log-format",
                    "json",
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                preexec_fn=limit_address_space(SERVER_MEMORY_BYTES),
            )

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited:\n{self.log_tail()}"
            try:
                if self.request("GET", "/health", b"", {}).status == 200:
                    self._log_offset = self.log_path.stat().st_size
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError("the server did not become ready")

    def request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        """One request on a fresh connection; the whole response read (a stream to its end).
        TimeoutError when the server does not answer within REQUEST_TIMEOUT_S."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            return Answer(response.status, response.getheader("Content-Type", ""), data)
        finally:
            connection.close()

    def problems(self) -> list[str]:
        """What the log says went wrong since the last call (and whether the process died)."""
        found = []
        if self.proc.poll() is not None:
            found.append(f"the server exited with {self.proc.returncode}")
        with self.log_path.open("rb") as log:
            log.seek(self._log_offset)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._log_offset += len(complete)
        for line in complete.decode("utf-8", "replace").splitlines():
            found += _line_problems(line)
        return found

    def log_tail(self, size: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-size:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _line_problems(line: str) -> list[str]:
    try:
        entry = json.loads(line)
    except ValueError:
        return [f"not a log line: {line[:300]}"] if "Traceback" in line else []
    if not isinstance(entry, dict):
        return []
    if "exc" in entry or str(entry.get("msg", "")).startswith("unhandled error"):
        return [f"{entry.get('msg')}\n{entry.get('exc', '')}"]
    if entry.get("logger") == "edgeserve.access":
        status = entry.get("status")
        error_status = entry.get("error_status")
        if (isinstance(status, int) and status >= 500) or (
            isinstance(error_status, int) and error_status >= 500
        ):
            return [f"a 5xx: {entry.get('msg')} (error_status {error_status})"]
    return []
