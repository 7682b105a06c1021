"""Answers read for tool calls over HTTP, on the app with a stand-in engine that answers a
scripted text (test_media_http's StubEngine): an answer the tool-call readers cannot take must
reach the client as content, never as a 500 or a stream cut short.

Found by tests/fuzz/test_fuzz_tool_calls.py: a call whose arguments hold an integer of more
than 4,300 digits (a small model repeating a digit) made Python's JSON decoder raise a
ValueError that the readers did not catch; the answer was a 500, or its stream ended without
its last events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from edgeserve.config import Settings
from edgeserve.engine.types import Finished, GenerationRequest, TextDelta
from edgeserve.http.app import create_app
from tests.unit.test_media_http import StubEngine, StubGeneration

LONG_NUMBER = "7" * 4301
ANSWERS = [
    '{"name": "get_weather", "arguments": {"days": ' + LONG_NUMBER + "}}",
    '<tool_call>{"name": "get_weather", "arguments": {"days": ' + LONG_NUMBER + "}}</tool_call>",
    '{"name": "get_weather", "arguments": "{\\"days\\": ' + LONG_NUMBER + '}"}',
]
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}


class ScriptedGeneration(StubGeneration):
    async def events(self) -> AsyncIterator[TextDelta | Finished]:
        text = self.engine.answer
        for start in range(0, len(text), 50):
            yield TextDelta(0, text[start : start + 50], generated=1)
        yield Finished(0, "stop", completion_tokens=1)


@dataclass
class ScriptedEngine(StubEngine):
    """The stand-in engine, answering `answer` in pieces of 50 characters."""

    answer: str = ""

    def generate(self, request: GenerationRequest) -> ScriptedGeneration:
        return ScriptedGeneration(self, request)


@pytest.fixture
def make_client(aiohttp_client):
    async def make(answer: str):
        engine = ScriptedEngine(answer=answer)
        return await aiohttp_client(create_app(Settings(model="m.gguf"), engine))

    return make


def chat(stream: bool) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [TOOL],
        "stream": stream,
    }


@pytest.mark.parametrize("answer", ANSWERS)
async def test_an_unreadable_call_is_answered_as_content(make_client, answer):
    client = await make_client(answer)
    response = await client.post("/v1/chat/completions", json=chat(stream=False))
    assert response.status == 200
    [choice] = (await response.json())["choices"]
    assert choice["message"]["content"] == answer
    assert choice["message"]["tool_calls"] is None
    assert choice["finish_reason"] == "stop"


@pytest.mark.parametrize("answer", ANSWERS)
async def test_an_unreadable_call_streams_to_its_end(make_client, answer):
    """The stream ends as every stream does; the number reaches the client as content (what
    a call had sent before it broke off stays sent, as README's streaming paragraph says)."""
    client = await make_client(answer)
    response = await client.post("/v1/chat/completions", json=chat(stream=True))
    assert response.status == 200
    lines = [line for line in (await response.text()).splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert LONG_NUMBER in "".join(delta.get("content") or "" for delta in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_an_unreadable_call_is_a_text_block_in_messages(make_client):
    client = await make_client(ANSWERS[0])
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
    }
    response = await client.post("/v1/messages", json=body)
    assert response.status == 200
    answer = await response.json()
    assert answer["content"] == [{"type": "text", "text": ANSWERS[0]}]
    assert answer["stop_reason"] == "end_turn"
