"""LangChain's ChatOpenAI, unchanged: invoke, stream, tools, structured output."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from langchain_openai import ChatOpenAI

from tests.clients.models import CITY_PROMPT, WEATHER_PROMPT, City, get_weather
from tests.sdk.conftest import base_url

pytestmark = pytest.mark.needs_model


@pytest.fixture
async def llm(server) -> AsyncIterator[ChatOpenAI]:
    http = httpx.AsyncClient()
    yield ChatOpenAI(
        base_url=base_url(server),
        api_key="x",
        model="m",
        temperature=0,
        max_tokens=48,
        max_retries=0,
        http_async_client=http,
    )
    await http.aclose()


async def test_invoke(llm):
    message = await llm.ainvoke("Say hello in one word.")
    assert isinstance(message.content, str) and message.content
    assert message.response_metadata["finish_reason"] in ("stop", "length")


async def test_stream(llm):
    chunks = [chunk async for chunk in llm.astream("Count from one to five.")]
    assert len(chunks) > 2
    assert "".join(chunk.content for chunk in chunks)


async def test_a_forced_tool_call(llm):
    message = await llm.bind_tools([get_weather], tool_choice="get_weather").ainvoke(WEATHER_PROMPT)
    [call] = message.tool_calls
    assert call["name"] == "get_weather"
    assert isinstance(call["args"]["city"], str)


async def test_a_streamed_tool_call(llm):
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    chunks = [chunk async for chunk in bound.astream(WEATHER_PROMPT)]
    assert len(chunks) > 2, "the call came in one piece"
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    [call] = merged.tool_calls
    assert call["name"] == "get_weather"
    assert isinstance(call["args"]["city"], str)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
async def test_structured_output(llm, method):
    structured = llm.with_structured_output(City, method=method)
    prompt = CITY_PROMPT + (
        " Answer in JSON with keys name and country." if method == "json_mode" else ""
    )
    city = await structured.ainvoke(prompt)
    assert isinstance(city, City)
