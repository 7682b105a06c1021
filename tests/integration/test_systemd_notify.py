"""Playing systemd: a notify socket, then READY=1 / WATCHDOG=1 / STOPPING=1 from the server."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from edgeserve.config import Settings
from edgeserve.engine.types import EngineStats
from edgeserve.http.server import _serve
from tests.integration.test_server_process import free_port

WATCHDOG_USEC = 400_000  # pings every 0.2 s


@dataclass
class Notify:
    """The bound notify socket and every datagram received, with its arrival time."""

    sock: socket.socket
    address: str
    received: list[tuple[float, str]] = field(default_factory=list)

    async def pump(self) -> None:
        """Receive datagrams until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.sock, 4096)
            self.received.append((time.monotonic(), data.decode()))

    def times(self, line: str) -> list[float]:
        """Arrival times of the datagrams that contain `line`."""
        return [t for t, text in self.received if line in text.splitlines()]

    async def wait_for(self, line: str, timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        while not self.times(line):
            assert time.monotonic() < deadline, f"no {line} in {self.received}"
            await asyncio.sleep(0.01)
        return self.times(line)[0]


@pytest.fixture
def notify(tmp_path) -> Iterator[Notify]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(tmp_path / "notify.sock"))
        sock.setblocking(False)
        yield Notify(sock, str(tmp_path / "notify.sock"))


async def poll_health(
    session: aiohttp.ClientSession, url: str, log: list[tuple[float, int]], stop: asyncio.Event
) -> None:
    """GET /health in a loop, recording (time sent, status); connection errors are skipped."""
    while not stop.is_set():
        sent = time.monotonic()
        try:
            async with session.get(f"{url}/health") as resp:
                log.append((sent, resp.status))
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.005)


def check_ready_after_health(health: list[tuple[float, int]], ready_at: float) -> None:
    """Every 503 was asked before READY=1 arrived, and every poll asked after it got 200."""
    late_503 = [t for t, status in health if status == 503 and t > ready_at]
    assert not late_503, "READY=1 arrived while /health still answered 503"
    after = [status for t, status in health if t > ready_at]
    assert after and set(after) == {200}, after


async def test_serve_process_speaks_the_notify_protocol(model_path, notify):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESERVE_", "API_"))}
    env.update(NOTIFY_SOCKET=notify.address, WATCHDOG_USEC=str(WATCHDOG_USEC))
    env.pop("WATCHDOG_PID", None)
    pump = asyncio.create_task(notify.pump())
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "edgeserve", "serve", "--model", str(model_path)),
            *("--port", str(port), "--threads", "1", "--ctx-size", "1024", "--no-mmap"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    health: list[tuple[float, int]] = []
    stop = asyncio.Event()
    try:
        async with aiohttp.ClientSession() as session:
            poller = asyncio.create_task(poll_health(session, url, health, stop))
            ready_at = await notify.wait_for("READY=1")
            await asyncio.sleep(0.6)  # a few more polls and watchdog pings
            stop.set()
            await poller
        check_ready_after_health(health, ready_at)
        assert 200 in [status for _, status in health]
        assert len([t for t in notify.times("WATCHDOG=1") if t > ready_at]) >= 2
        ready = next(text for _, text in notify.received if "READY=1" in text)
        assert "STATUS=serving" in ready
        assert any(text.startswith("STATUS=loading") for _, text in notify.received)
        assert not notify.times("STOPPING=1")
        proc.send_signal(signal.SIGTERM)
        await notify.wait_for("STOPPING=1", timeout=30)
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, err
    finally:
        pump.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


class GatedEngine:
    """Stands in for the engine in `_serve`: loads only when the test says so."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.died = threading.Event()
        self.load_error = None
        self.loaded = False
        self.can_generate = True
        self.media_kinds: frozenset[str] = frozenset()

    def start(self) -> None:
        pass

    def wait_loaded(self, timeout: float | None = None) -> bool:
        self.release.wait(timeout)
        self.loaded = self.release.is_set()
        return self.loaded

    def wait_stopped(self) -> None:
        self.died.wait()

    def stop_accepting(self) -> None:
        pass

    def stalled_for(self) -> float:
        return 0.0

    def close(self, timeout: float = 30.0) -> None:
        self.release.set()
        self.died.set()

    def stats(self) -> EngineStats:
        return EngineStats(
            loaded=self.loaded,
            n_ctx=256,
            parallel=1,
            busy_slots=0,
            queue_length=0,
            gpu_offload=False,
            n_gpu_layers=0,
        )


async def test_ready_waits_for_the_model(notify, monkeypatch):
    """Deterministic order: while the load is held back, no READY=1 and /health is 503."""
    monkeypatch.setenv("NOTIFY_SOCKET", notify.address)
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    port = free_port()
    engine = GatedEngine()
    settings = Settings(model="gated.gguf", port=port, drain_timeout_s=1.0)
    pump = asyncio.create_task(notify.pump())
    server = asyncio.create_task(_serve(settings, engine))  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{port}"
    health: list[tuple[float, int]] = []
    stop = asyncio.Event()
    try:
        async with aiohttp.ClientSession() as session:
            poller = asyncio.create_task(poll_health(session, url, health, stop))
            await notify.wait_for("WATCHDOG=1")
            await asyncio.sleep(0.5)  # loading: the loop pings, /health says 503, no READY
            assert not notify.times("READY=1")
            assert health and {status for _, status in health} == {503}
            assert len(notify.times("WATCHDOG=1")) >= 2
            engine.release.set()
            ready_at = await notify.wait_for("READY=1", timeout=10)
            await asyncio.sleep(0.2)
            stop.set()
            await poller
        check_ready_after_health(health, ready_at)
        engine.died.set()  # the engine thread ends: the server drains and exits 1
        assert await asyncio.wait_for(server, 30) == 1
        stopping_at = await notify.wait_for("STOPPING=1", timeout=5)
        assert stopping_at > ready_at
    finally:
        engine.close()
        pump.cancel()
        if not server.done():
            server.cancel()
