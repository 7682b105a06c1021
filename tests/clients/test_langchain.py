"""LangChain's ChatOpenAI, unchanged: invoke, stream, tools, structured output."""

from __future__ import annotations

import pytest
from langchain_openai import ChatOpenAI

from tests.clients.models import (
    CITY_PROMPT,
    WEATHER_PROMPT,
    Answers,
    City,
    get_weather,
)
from tests.sdk.conftest import base_url

pytestmark = pytest.mark.needs_model

MAX_TOKENS = 48
HELLO = "Say hello in one word."
COUNT = "Count from one to five."


@pytest.fixture
async def llm(server, answers: Answers) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=base_url(server),
        api_key="x",
        model="m",
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,
        http_async_client=answers.http,
    )


async def test_invoke(llm, answers):
    message = await llm.ainvoke(HELLO)
    assert message.content == answers.last()
    assert message.response_metadata["finish_reason"] in ("stop", "length")


async def test_stream(llm, answers):
    chunks = [chunk async for chunk in llm.astream(COUNT)]
    assert len(chunks) > 2
    assert "".join(chunk.content for chunk in chunks) == answers.last()


async def test_a_forced_tool_call(llm):
    message = await llm.bind_tools([get_weather], tool_choice="get_weather").ainvoke(WEATHER_PROMPT)
    [call] = message.tool_calls
    assert call["name"] == "get_weather"
    assert call["args"] == {"city": "Paris"}


async def test_a_streamed_tool_call(llm):
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    chunks = [chunk async for chunk in bound.astream(WEATHER_PROMPT)]
    assert len(chunks) > 2, "the call came in one piece"
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    [call] = merged.tool_calls
    assert call["name"] == "get_weather"
    assert call["args"] == {"city": "Paris"}


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
async def test_structured_output(llm, answers, method):
    if method == "json_mode":
        # The object has no schema: the model may add keys (about 30 tokens with four), and an
        # answer cut at max_tokens is unfinished JSON, which the library rightly refuses.
        llm = llm.model_copy(update={"max_tokens": 2 * MAX_TOKENS})
    structured = llm.with_structured_output(City, method=method)
    prompt = CITY_PROMPT + (
        " Answer in JSON with keys name and country." if method == "json_mode" else ""
    )
    city = await structured.ainvoke(prompt)
    assert isinstance(city, City)
    assert city.model_dump() == answers.city()
