"""llama-index's Ollama LLM (llama-index-llms-ollama), unchanged, against edgeserve's Ollama API:
chat, streamed chat, completion and structured prediction, each answer the engine's own greedy
answer to the same conversation. With its defaults the library reads the model's context length
from /api/show's `model_info` and sends it as `num_ctx` on every request: the GGUF's training
context (32768 for Gemma 3), larger than the tests' --ctx-size, which must not be refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.llms.ollama import Ollama

from edgeserve import grammars
from edgeserve.engine.types import ChatPrompt, ChatTurn, GrammarSpec
from tests.clients.models import CITY_PROMPT, COUNT_PROMPT, HELLO_PROMPT, City
from tests.sdk.test_ollama_sdk import MODEL, engine_answer, host

pytestmark = pytest.mark.needs_model

TOKENS = 8


@pytest.fixture
async def llama_index_ollama(server: Any) -> AsyncIterator[Callable[..., Awaitable[Ollama]]]:
    """Makes Ollama LLMs of `server` with their default context window, which each learns
    from /api/show through its blocking client: read on a thread, as the loop serving it must
    keep running (an application calls it from its own thread). Their clients close after
    the test."""
    instances: list[Ollama] = []

    async def make(tokens: int = TOKENS) -> Ollama:
        llm = Ollama(
            model=MODEL,
            base_url=host(server),
            temperature=0,
            request_timeout=60,
            additional_kwargs={"num_predict": tokens},
        )
        instances.append(llm)
        await asyncio.to_thread(llm.get_context_window)
        return llm

    yield make
    for llm in instances:
        llm.client._client.close()
        await llm.async_client._client.aclose()


def user(text: str) -> ChatPrompt:
    return ChatPrompt((ChatTurn("user", text),))


async def test_the_context_window_is_the_model_s_and_requests_carrying_it_are_served(
    llama_index_ollama, engine
):
    llm = await llama_index_ollama()
    assert llm.context_window == 32768 > engine.stats().n_ctx  # gemma3.context_length
    text, end, prompt_tokens = await engine_answer(engine, user(HELLO_PROMPT), TOKENS)
    response = await llm.achat([ChatMessage(role="user", content=HELLO_PROMPT)])
    assert response.message.content == text
    usage = response.raw["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        prompt_tokens,
        end.completion_tokens,
    )


async def test_streamed_chat_and_completion(llama_index_ollama, engine):
    llm = await llama_index_ollama()
    counted, _, _ = await engine_answer(engine, user(COUNT_PROMPT), TOKENS)
    stream = await llm.astream_chat([ChatMessage(role="user", content=COUNT_PROMPT)])
    deltas = [part.delta async for part in stream]
    assert len(deltas) > 2 and "".join(d or "" for d in deltas) == counted
    hello, _, _ = await engine_answer(engine, user(HELLO_PROMPT), TOKENS)
    completion = await llm.acomplete(HELLO_PROMPT)
    assert completion.text == hello


async def test_structured_prediction(llama_index_ollama, engine):
    schema = City.model_json_schema()
    grammar = GrammarSpec("gbnf", grammars.schema_grammar(schema))
    text, _, _ = await engine_answer(engine, user(CITY_PROMPT), 60, grammar)
    llm = await llama_index_ollama(tokens=60)
    city = await llm.astructured_predict(City, PromptTemplate(CITY_PROMPT))
    assert isinstance(city, City) and city == City.model_validate_json(text)
