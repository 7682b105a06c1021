"""A bug that raises while a stream is being answered (found when tool-call reading raised on an
integer of more than 4,300 digits: tests/unit/test_tool_answers_http.py): the request is logged
as a 500 with its traceback and the connection is closed, so the client sees the stream end
broken instead of waiting for it forever; an answer not yet started is a plain 500. On the app
with test_media_http's stand-in engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from edgeserve.config import Settings
from edgeserve.engine.types import Finished, GenerationRequest, TextDelta
from edgeserve.http.app import create_app
from tests.unit.test_media_http import StubEngine, StubGeneration

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
WAIT_S = 10


class Bug(RuntimeError):
    """The stand-in for a bug in the server."""


class FailingGeneration(StubGeneration):
    async def events(self) -> AsyncIterator[TextDelta | Finished]:
        yield TextDelta(0, "Hel", generated=1)
        raise Bug("a bug while answering")


@dataclass
class FailingEngine(StubEngine):
    """The stand-in engine, whose generations fail after their first text."""

    def generate(self, request: GenerationRequest) -> FailingGeneration:
        return FailingGeneration(self, request)


@pytest.fixture
async def client(aiohttp_client):
    return await aiohttp_client(create_app(Settings(model="m.gguf"), FailingEngine()))


async def test_a_stream_that_fails_ends_its_connection(client, caplog):
    caplog.set_level(logging.ERROR, logger="edgeserve.http")
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status == 200
    with pytest.raises(aiohttp.ClientPayloadError):
        await asyncio.wait_for(response.read(), WAIT_S)
    assert any(record.exc_info and record.exc_info[0] is Bug for record in caplog.records)


async def test_an_answer_that_fails_before_it_starts_is_a_500(client):
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert (response.status, await response.text()) == (500, "Internal Server Error")
