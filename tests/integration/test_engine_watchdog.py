"""A wedged engine thread (stuck inside the backend with work waiting) makes the server exit 1,
as a dead one does, so that its supervisor restarts it. The engine runs on FakeBackend (a
scripted stand-in, see tests/unit/fake_backend.py) whose decode can be held back."""

from __future__ import annotations

import asyncio
import threading

import aiohttp

from edgeserve.config import Settings
from edgeserve.engine.types import EngineConfig
from edgeserve.engine.worker import Engine
from edgeserve.http.server import _serve
from tests.integration.test_server_process import free_port
from tests.unit.fake_backend import FakeBackend

WEDGE_S = 2.0


async def test_a_wedged_engine_thread_makes_the_server_exit_1(caplog):
    release = threading.Event()

    def wedging_backend(config: EngineConfig) -> FakeBackend:
        backend = FakeBackend(config)
        backend.before_decode = lambda batch: (release.wait(WEDGE_S), None)[1]
        return backend

    engine = Engine(
        EngineConfig(model_path="fake", n_ctx=256, parallel=2, n_batch=64),
        backend_factory=wedging_backend,
    )
    port = free_port()
    settings = Settings(model="fake", port=port, engine_stall_s=0.5, drain_timeout_s=0.2)
    server = asyncio.create_task(_serve(settings, engine))
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.02)
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            stuck = asyncio.create_task(session.post(f"{url}/v1/chat/completions", json=body))
            code = await asyncio.wait_for(server, WEDGE_S + 10)
            stuck.cancel()
    finally:
        release.set()
        await asyncio.to_thread(engine.close)
    assert code == 1
    assert "the engine thread is stuck" in caplog.text
