"""The real `edgeserve serve` process: startup, readiness, overload, drain, bad models."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import EngineConfig
from edgeserve.engine.worker import Engine
from edgeserve.http.app import create_app
from tests.integration.conftest import EOS_BAN
from tests.integration.sse_client import parse_events

LONG = {"role": "user", "content": "Write a very long story."}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free port; `url` is its base URL (https:// when `args` give it a
    certificate)."""

    def __init__(self, model: Path, *args: str) -> None:
        self.port = free_port()
        scheme = "https" if "--ssl-certfile" in args else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESERVE_", "API_"))}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edgeserve",
                "serve",
                "--model",
                str(model),
                "--port",
                str(self.port),
                "--threads",
                "1",
                "--ctx-size",
                "1024",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            try:
                async with session.get(f"{self.url}/health") as resp:
                    if resp.status == 200:
                        return
                    assert resp.status == 503
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
        raise TimeoutError("server did not become ready")

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err


@pytest.fixture
def server_factory(model_path: Path) -> Iterator[object]:
    started: list[Server] = []

    def start(*args: str) -> Server:
        server = Server(model_path, *args)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate()


async def test_health_and_requests_are_503_until_the_model_is_loaded(aiohttp_client, model_path):
    engine = Engine(EngineConfig(model_path=str(model_path), n_ctx=256, parallel=1))
    client = await aiohttp_client(create_app(Settings(model=str(model_path)), EngineClient(engine)))
    resp = await client.get("/health")
    assert resp.status == 503
    assert (await resp.json())["status"] == "loading"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    resp = await client.post("/v1/chat/completions", json=chat)
    assert resp.status == 503 and resp.headers["Retry-After"] == "2"
    assert (await resp.json())["detail"] == "The model is still loading; retry in a few seconds."
    resp = await client.get("/v1/models")  # what reference clients poll to know it is up
    assert resp.status == 503 and resp.headers["Retry-After"] == "2"
    engine.start()
    assert await asyncio.to_thread(engine.wait_loaded, 60)
    resp = await client.get("/health")
    assert resp.status == 200
    resp = await client.get("/v1/models")
    assert resp.status == 200 and (await resp.json())["data"][0]["id"]
    engine.close()


async def test_models_polled_from_process_start_is_503_loading_until_chat_works(server_factory):
    # Reference clients poll /v1/models to learn that the server is up: from the first
    # connection the process accepts, every answer is 503 + Retry-After saying the model is
    # loading, /health agrees, and once /v1/models is 200 a chat is answered.
    server = server_factory("--log-level", "warning")  # no access lines filling its pipe
    loading = 0
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the model never finished loading"
            assert server.proc.poll() is None, server.proc.communicate()[1]
            try:
                async with session.get(f"{server.url}/health") as resp:
                    health = resp.status
                async with session.get(f"{server.url}/v1/models") as resp:
                    status, body = resp.status, await resp.json()
                    retry_after = resp.headers.get("Retry-After")
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.01)
                continue
            if status == 200:
                break
            assert health == 503, "/health said ready before /v1/models did"
            assert (status, retry_after) == (503, "2"), body
            assert body["detail"] == "The model is still loading; retry in a few seconds."
            loading += 1
            await asyncio.sleep(0.02)
        assert loading > 0, "no request arrived while the model loaded"
        assert body["data"][0]["id"] == "gemma-3-270m-q4_k_m"
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with session.post(f"{server.url}/v1/chat/completions", json=chat) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["message"]["content"] is not None
    assert server.stop()[0] == 0


async def test_serve_answers_then_sigterm_drains_and_exits_zero(server_factory):
    server = server_factory()
    async with aiohttp.ClientSession() as session:
        await server.wait_ready(session)
        body = {
            "model": "m",
            "messages": [LONG],
            "max_tokens": 40,
            "logit_bias": EOS_BAN,
            "stream": True,
        }
        async with session.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            first = await resp.content.readuntil(b"\n\n")
            server.proc.send_signal(signal.SIGTERM)
            rest = await resp.read()
        events, done = parse_events(first + rest)
        assert done, "a stream admitted before SIGTERM runs to its end"
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    code, err = server.stop()
    assert code == 0, err
    assert "Traceback" not in err


async def test_full_queue_answers_503_with_retry_after(server_factory):
    server = server_factory("--parallel", "1", "--max-queue", "1")
    async with aiohttp.ClientSession() as session:
        await server.wait_ready(session)
        body = {"model": "m", "messages": [LONG], "max_tokens": 2000, "logit_bias": EOS_BAN}
        url = f"{server.url}/v1/chat/completions"
        running = await session.post(url, json={**body, "stream": True})
        await running.content.readuntil(b"\n\n")
        queued = asyncio.create_task(session.post(url, json=body))
        for _ in range(100):
            async with session.get(f"{server.url}/health") as resp:
                if (await resp.json())["queue_length"] == 1:
                    break
            await asyncio.sleep(0.02)
        async with session.post(url, json=body) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"].isdigit()
            answer = await resp.json()
            assert answer["detail"].startswith("Server is busy")
            assert answer["message"] == answer["detail"]
        running.close()
        queued.cancel()
        for _ in range(200):
            async with session.get(f"{server.url}/health") as resp:
                health = await resp.json()
            if health["busy_slots"] == 0 and health["queue_length"] == 0:
                break
            await asyncio.sleep(0.05)
        assert health["busy_slots"] == 0 and health["queue_length"] == 0
    assert server.stop()[0] == 0


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"this is not a gguf file at all" * 100, "is not a loadable GGUF"),
        (b"GGUF" + bytes(4096), "is not a loadable GGUF"),
    ],
)
def test_unloadable_model_exits_2_with_one_line(tmp_path, content, expected):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(content)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeserve",
            "serve",
            "--model",
            str(bad),
            "--port",
            str(free_port()),
            "--log-level",
            "warning",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("edgeserve: error: ") and expected in lines[0]
