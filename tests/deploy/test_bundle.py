"""The `make dist` bundle, driven over HTTP from an empty environment.

The bundle is built once (deploy/bundle.py, ~35 s, started in the background as soon as the
session is collected: bundle_build.py) and reused while edgeserve's sources and the venv's
packages are unchanged. One bundle process serves the whole module: it runs with only PATH
set, the model found in `$EDGESERVE_HOME/models` (the installed default model's cache), a flag
(`--api-key`) and environment settings (`API_MODEL_NAME`, `EDGESERVE_LOG_FORMAT`), and a
notify socket standing in for systemd.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from edgeserve import __version__
from edgeserve.default_model import FILE
from tests.deploy.bundle_build import BUILD
from tests.deploy.test_systemd import REPO, needs_analyze, parse_unit, run_make, verify
from tests.integration.sse_client import parse_events, stream_text
from tests.integration.test_server_process import free_port

KEY = "bundle-key"
EMPTY_ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="session")
def bundle() -> Path:
    """dist/edgeserve/edgeserve, built now unless the one there is up to date."""
    if importlib.util.find_spec("PyInstaller") is None:
        raise RuntimeError("PyInstaller is missing: run `make test` (the test extra has it)")
    code, output = BUILD.finished()  # started as the session was collected (conftest.py)
    assert code == 0, output
    executable = REPO / "dist" / "edgeserve" / "edgeserve"
    assert executable.is_file()
    return executable


@dataclass
class Notify:
    """A notify socket read by a thread; every datagram received."""

    path: Path
    received: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.1)
        self.closed = threading.Event()
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        while not self.closed.is_set():
            try:
                self.received.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def lines(self) -> list[str]:
        return [line for text in list(self.received) for line in text.splitlines()]

    def wait_for(self, line: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
        """Wait for `line` from `proc`, failing with its stderr if it exits first."""
        deadline = time.monotonic() + timeout
        while line not in self.lines():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, f"no {line} in {self.received}"
            time.sleep(0.02)

    def close(self) -> None:
        self.closed.set()
        self.pump.join()  # the socket is closed only once nothing reads it
        self.sock.close()


@dataclass
class Bundled:
    """The running bundle process, its base URL and notify socket."""

    proc: subprocess.Popen[str]
    url: str
    notify: Notify

    def request(
        self, path: str, body: dict[str, Any] | None = None, *, key: str | None = KEY
    ) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


@pytest.fixture(scope="module")
def served(bundle, model_path, tmp_path_factory) -> Iterator[Bundled]:
    """The bundle serving from an empty environment in a folder of its own."""
    home = tmp_path_factory.mktemp("bundle")
    (home / "models").mkdir()
    (home / "models" / FILE).symlink_to(model_path)
    notify = Notify(home / "notify.sock")
    port = free_port()
    env = {
        **EMPTY_ENV,
        "EDGESERVE_HOME": str(home),
        "API_MODEL_NAME": "bundled",
        "EDGESERVE_LOG_FORMAT": "json",
        "NOTIFY_SOCKET": str(notify.path),
        "WATCHDOG_USEC": "400000",
    }
    args = ("serve", "--port", str(port), "--api-key", KEY, "--threads", "1")
    proc = subprocess.Popen(
        [str(bundle), *args, "--ctx-size", "1024", "--parallel", "2"],
        cwd=home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        notify.wait_for("READY=1", proc)
        yield Bundled(proc, f"http://127.0.0.1:{port}", notify)
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_ready_after_health_and_the_watchdog_is_pinged(served):
    status, body = served.request("/health", key=None)
    assert status == 200, body
    time.sleep(0.5)
    assert served.notify.lines().count("WATCHDOG=1") >= 2
    assert any(line.startswith("STATUS=serving bundled") for line in served.notify.lines())


def test_flag_and_environment_are_honoured(served):
    assert served.request("/v1/models", key=None)[0] == 401  # --api-key
    status, body = served.request("/v1/models")
    assert status == 200
    assert json.loads(body)["data"][0]["id"] == "bundled"  # API_MODEL_NAME


def test_chat(served):
    status, body = served.request(
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert status == 200, body
    answer = json.loads(body)
    assert answer["usage"]["completion_tokens"] <= 4
    assert answer["choices"][0]["message"]["role"] == "assistant"


def test_stream(served):
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Count: one, two,"}],
        "max_tokens": 6,
        "stream": True,
    }
    status, raw = served.request("/v1/chat/completions", body)
    assert status == 200, raw
    events, done = parse_events(raw)
    assert done
    assert stream_text(events)


def test_the_chat_page_is_bundled(served):
    webui = REPO / "edgeserve" / "http" / "webui"
    assert served.request("/", key=None) == (200, (webui / "index.html").read_bytes())
    assert served.request("/webui/app.js", key=None) == (200, (webui / "app.js").read_bytes())


def test_score(served):
    status, body = served.request(
        "/v1/score/evaluation", {"model": "rm", "messages": ["Paris is in France.", "a"]}
    )
    assert status == 200, body
    scores = json.loads(body)["scores"]
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)


def test_sigterm_drains_and_exits_zero_with_json_logs(served):
    served.proc.send_signal(signal.SIGTERM)
    _, err = served.proc.communicate(timeout=60)
    assert served.proc.returncode == 0, err
    assert "STOPPING=1" in served.notify.lines()
    # EDGESERVE_LOG_FORMAT=json: edgeserve's records are JSON lines (llama.cpp may add its own)
    assert " INFO edgeserve" not in err
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(r["msg"].startswith("listening on http://127.0.0.1:") for r in records), err


def test_version_and_no_model(bundle, tmp_path):
    done = subprocess.run([bundle, "--version"], env=EMPTY_ENV, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, f"edgeserve {__version__}\n")
    env = {**EMPTY_ENV, "EDGESERVE_HOME": str(tmp_path)}
    done = subprocess.run([bundle, "serve"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == (
        "edgeserve: error: no model: pass --model PATH (or put the default model at "
        f"{tmp_path / 'models' / FILE})\n"
    )


@needs_analyze
def test_systemd_unit_for_the_bundle_passes_verify(bundle, tmp_path):
    """`make install-systemd BUNDLE=1`: ExecStart is the bundle; systemd-analyze accepts it."""
    done = run_make("install-systemd", f"DESTDIR={tmp_path}", "BUNDLE=1")
    assert done.returncode == 0, done.stderr
    (unit,) = tmp_path.glob("**/edgeserve.service")
    service = parse_unit(unit.read_text())["Service"]
    assert service["ExecStart"] == [f"{bundle} serve"]
    assert service["WorkingDirectory"] == [str(REPO)]
    checked = verify(unit)
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), checked
