"""LiteLLM, unchanged, as an OpenAI-compatible provider: completion, stream, tools, streamed
tools."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import litellm
import pytest

from tests.clients.models import WEATHER_PARAMETERS, WEATHER_PROMPT
from tests.sdk.conftest import base_url

pytestmark = pytest.mark.needs_model

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS},
}
FORCED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(autouse=True)
async def close_cached_clients() -> AsyncIterator[None]:
    """LiteLLM keeps its HTTP clients in a cache for the process; close them after each test
    (their sockets point at this test's server)."""
    yield
    await litellm.close_litellm_async_clients()


def call_args(server) -> dict[str, Any]:
    return {
        "model": "openai/m",
        "api_base": base_url(server),
        "api_key": "x",
        "max_tokens": 48,
        "temperature": 0,
        "num_retries": 0,
    }


async def test_completion(server):
    response = await litellm.acompletion(
        messages=[{"role": "user", "content": "Say hello in one word."}], **call_args(server)
    )
    assert response.choices[0].message.content
    assert response.usage.completion_tokens > 0


async def test_stream(server):
    stream = await litellm.acompletion(
        messages=[{"role": "user", "content": "Count from one to five."}],
        stream=True,
        **call_args(server),
    )
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream]
    assert len(pieces) > 2 and "".join(pieces)


async def test_a_forced_tool_call(server):
    response = await litellm.acompletion(
        messages=[{"role": "user", "content": WEATHER_PROMPT}],
        tools=[TOOL],
        tool_choice=FORCED,
        **call_args(server),
    )
    [call] = response.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


async def test_a_streamed_tool_call(server):
    stream = await litellm.acompletion(
        messages=[{"role": "user", "content": WEATHER_PROMPT}],
        tools=[TOOL],
        tool_choice=FORCED,
        stream=True,
        **call_args(server),
    )
    chunks = [chunk async for chunk in stream]
    rebuilt = litellm.stream_chunk_builder(chunks)
    [call] = rebuilt.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    assert rebuilt.choices[0].finish_reason == "tool_calls"
