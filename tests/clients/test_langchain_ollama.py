"""LangChain's ChatOllama (langchain-ollama), unchanged, against edgeserve's Ollama API:
invoke, stream, structured output and a tool call, each answer the engine's own greedy answer
to the same conversation; the model checked through /api/tags (`validate_model_on_init`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from langchain_ollama import ChatOllama

from edgeserve import grammars
from edgeserve.engine.types import ChatPrompt, ChatTurn, GrammarSpec
from tests.clients.models import (
    CITY_PROMPT,
    COUNT_PROMPT,
    HELLO_PROMPT,
    WEATHER_PROMPT,
    City,
    get_weather,
)
from tests.sdk.test_ollama_sdk import CALL_FORMAT, MODEL, call_grammar, engine_answer, host

pytestmark = pytest.mark.needs_model

TOKENS = 8


@pytest.fixture
async def made() -> AsyncIterator[list[ChatOllama]]:
    """The ChatOllama instances a test made, their HTTP clients closed after it."""
    instances: list[ChatOllama] = []
    yield instances
    for llm in instances:
        llm._client._client.close()
        await llm._async_client._client.aclose()


@pytest.fixture
def chat_ollama(server: Any, made: list[ChatOllama]) -> Callable[..., Awaitable[ChatOllama]]:
    """Make a ChatOllama of `server` on a thread: it checks the model through the blocking
    client, and the loop that serves the check must keep running."""

    async def make(**fields: Any) -> ChatOllama:
        llm = await asyncio.to_thread(
            ChatOllama,
            model=MODEL,
            base_url=host(server),
            temperature=0,
            num_predict=fields.pop("num_predict", TOKENS),
            validate_model_on_init=True,
            **fields,
        )
        made.append(llm)
        return llm

    return make


def user(text: str, tools: str | None = None) -> ChatPrompt:
    return ChatPrompt((ChatTurn("user", text),), None, tools)


async def test_invoke_and_stream(chat_ollama, engine):
    text, end, prompt_tokens = await engine_answer(engine, user(HELLO_PROMPT), TOKENS)
    llm = await chat_ollama()
    message = await llm.ainvoke(HELLO_PROMPT)
    assert message.content == text
    assert message.response_metadata["done_reason"] == end.reason
    usage = message.usage_metadata
    assert (usage["input_tokens"], usage["output_tokens"]) == (prompt_tokens, end.completion_tokens)
    counted, _, _ = await engine_answer(engine, user(COUNT_PROMPT), TOKENS)
    chunks = [chunk async for chunk in llm.astream(COUNT_PROMPT)]
    assert len(chunks) > 2 and "".join(chunk.content for chunk in chunks) == counted


async def test_structured_output(chat_ollama, engine):
    schema = City.model_json_schema()
    grammar = GrammarSpec("gbnf", grammars.schema_grammar(schema))
    text, _, _ = await engine_answer(engine, user(CITY_PROMPT), 60, grammar)
    llm = (await chat_ollama(num_predict=60)).with_structured_output(City)
    city = await llm.ainvoke(CITY_PROMPT)
    assert isinstance(city, City) and city == City.model_validate_json(text)


async def test_a_tool_call(chat_ollama, engine):
    """Ollama has no tool_choice: a `format` shaped as the call makes the model call."""
    llm = (await chat_ollama(num_predict=40)).bind_tools([get_weather])
    [tool] = llm.kwargs["tools"]
    tools = json.dumps([tool["function"]])
    grammar = call_grammar(tool["function"])
    text, _, _ = await engine_answer(engine, user(WEATHER_PROMPT, tools), 40, grammar)
    expected = json.loads(text)
    message = await llm.bind(format=CALL_FORMAT).ainvoke(WEATHER_PROMPT)
    [call] = message.tool_calls
    assert (call["name"], call["args"]) == (expected["name"], expected["arguments"])


async def test_an_unknown_model_is_refused_at_once(server):
    with pytest.raises(ValueError, match="not found"):
        await asyncio.to_thread(
            ChatOllama,
            model="llama3",
            base_url=host(server),
            validate_model_on_init=True,
            # no instance to close afterwards: its client's connection closes with the answer
            sync_client_kwargs={"headers": {"Connection": "close"}},
        )
