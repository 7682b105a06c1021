"""The official `openai` SDK against edgeserve on a real port (pytest-aiohttp's aiohttp_server),
around the session's one engine on the default Gemma model.

The sync client blocks, so tests call it through `asyncio.to_thread`: the event loop that
serves it must keep running."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.http.app import create_app
from tests.integration.conftest import settings

__all__ = ["settings"]

TIMEOUT_S = 120.0


@pytest.fixture
def make_server(aiohttp_server, engine, settings: Settings) -> Callable[..., Awaitable[TestServer]]:
    """Start an app on a real port; pass Settings overrides as keywords."""

    async def make(**overrides: Any) -> TestServer:
        app = create_app(replace(settings, **overrides), EngineClient(engine))
        return await aiohttp_server(app)

    return make


@pytest.fixture
async def server(make_server) -> TestServer:
    """The default app on a real port."""
    return await make_server()


def base_url(server: TestServer) -> str:
    """What an SDK user passes as base_url."""
    return str(server.make_url("/v1"))


def async_client(server: TestServer) -> openai.AsyncOpenAI:
    """An async SDK client of `server` (no retries, so errors surface at once)."""
    return openai.AsyncOpenAI(
        base_url=base_url(server), api_key="x", max_retries=0, timeout=TIMEOUT_S
    )


@pytest.fixture
async def aclient(server: TestServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """An async SDK client of the default app."""
    client = async_client(server)
    yield client
    await client.close()


@pytest.fixture
def sync_client(server: TestServer) -> Iterator[openai.OpenAI]:
    """A sync SDK client of the default app; call it only through asyncio.to_thread."""
    client = openai.OpenAI(base_url=base_url(server), api_key="x", max_retries=0, timeout=TIMEOUT_S)
    yield client
    client.close()


def assert_error_says(exc: openai.APIStatusError, detail: str) -> None:
    """The SDK error carries the reference's `detail` in its body, and edgeserve's `message`
    (the same text), which `str(exc)` shows: openai 3.10 and later print the `message` alone
    (`Error code: 400 - <message>`), earlier 3.x releases the whole body after the code."""
    assert exc.body == {"detail": detail, "message": detail}
    printed = (f"Error code: {exc.status_code} - {shown}" for shown in (detail, exc.body))
    assert str(exc) in printed
