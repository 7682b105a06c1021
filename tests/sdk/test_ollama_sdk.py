"""Ollama's API through the official `ollama` library, unchanged: chat and generate, streamed
and not, each answer the engine's own greedy answer to the same conversation; `format` (a
pydantic model's schema, "json"); tools, and a call's result sent back; embed and embeddings;
tags, ps, show, version; a request that only loads or unloads; and errors in Ollama's shape
(an unknown model, bad options, `think`, an oversized body, the registry's routes).
tests/unit/test_ollama_api.py covers the translation and the objects without a model."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import ollama
import pytest
from aiohttp.test_utils import TestServer
from pydantic import BaseModel, Field

from edgeserve import grammars
from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import (
    ChatPrompt,
    ChatTurn,
    EmbedRequest,
    Finished,
    GenerationRequest,
    GrammarSpec,
    SamplingParams,
)
from edgeserve.http.app import create_app
from tests.integration.engine_run import collect
from tests.integration.vision import chat, image_bytes, image_turn
from tests.sdk.conftest import TIMEOUT_S

pytestmark = pytest.mark.needs_model

MODEL = "gemma-test"  # --model-name in the tests' settings
TOKENS = 8
GREEDY = {"temperature": 0, "num_predict": TOKENS}
ASK = "Name three colours."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        # as the library sends it (its Tool model keeps these keys, in this order)
        "parameters": {
            "type": "object",
            "required": ["city"],
            "properties": {"city": {"type": "string"}},
        },
    },
}
CALL_FORMAT = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
    "required": ["name", "arguments"],
}
"""A `format` shaped as the call: Ollama has no tool_choice, so this is how a client makes
the model call."""


def call_grammar(function: dict[str, Any]) -> GrammarSpec:
    """The answer's grammar with `function` as the tool and CALL_FORMAT as the format."""
    call = grammars.tool_call_grammar([(function["name"], function["parameters"])])
    return GrammarSpec("gbnf", grammars.either([call, grammars.schema_grammar(CALL_FORMAT)]))


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


def host(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
async def olla(server: TestServer) -> AsyncIterator[ollama.AsyncClient]:
    client = ollama.AsyncClient(host=host(server), timeout=TIMEOUT_S)
    yield client
    await client._client.aclose()


async def engine_answer(
    engine: Any, prompt: ChatPrompt | str, tokens: int = TOKENS, grammar: GrammarSpec | None = None
) -> tuple[str, Finished, int]:
    """The engine's own greedy answer (no HTTP): its text, its end and the prompt's tokens."""
    params = SamplingParams(max_tokens=tokens, temperature=0, grammar=grammar)
    return await collect(engine, GenerationRequest(prompt, params))


def user(text: str) -> ChatPrompt:
    return ChatPrompt((ChatTurn("user", text),))


def assert_done(part: Any, end: Finished, prompt_tokens: int) -> None:
    """The last object: why it ended and the engine's counts, with timings in ns."""
    assert part.done and part.done_reason == end.reason
    assert (part.prompt_eval_count, part.eval_count) == (prompt_tokens, end.completion_tokens)
    assert part.prompt_eval_duration > 0 and part.eval_duration > 0
    assert part.total_duration >= part.prompt_eval_duration + part.eval_duration
    assert part.load_duration >= 0


async def test_chat_whole_and_streamed_is_the_engine_s_answer(olla, engine):
    text, end, prompt_tokens = await engine_answer(engine, user(ASK))
    messages = [{"role": "user", "content": ASK}]
    reply = await olla.chat(model=MODEL, messages=messages, options=GREEDY, stream=False)
    assert reply.model == MODEL and reply.message.role == "assistant"
    assert reply.message.content == text
    assert_done(reply, end, prompt_tokens)
    parts = [part async for part in await olla.chat(MODEL, messages, options=GREEDY, stream=True)]
    assert len(parts) > 2 and [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(part.message.content for part in parts) == text
    assert_done(parts[-1], end, prompt_tokens)


async def test_generate_renders_the_chat_template_or_sends_a_raw_prompt(olla, engine):
    text, end, prompt_tokens = await engine_answer(
        engine, ChatPrompt((ChatTurn("user", ASK),), "Be brief.")
    )
    reply = await olla.generate(MODEL, ASK, system="Be brief.", options=GREEDY)
    assert reply.response == text
    assert_done(reply, end, prompt_tokens)
    parts = [
        p
        async for p in await olla.generate(
            MODEL, ASK, system="Be brief.", options=GREEDY, stream=True
        )
    ]
    assert "".join(part.response for part in parts) == text and parts[-1].done
    raw_text, _, _ = await engine_answer(engine, "The capital of France is")
    raw = await olla.generate(MODEL, "The capital of France is", raw=True, options=GREEDY)
    assert raw.response == raw_text and raw_text != text


async def test_format_a_pydantic_schema_answers_that_validate(olla, engine):
    schema = City.model_json_schema()
    messages = [{"role": "user", "content": "Name the capital of France and its country."}]
    grammar = GrammarSpec("gbnf", grammars.schema_grammar(schema))
    text, _, _ = await engine_answer(engine, user(messages[0]["content"]), 60, grammar)
    reply = await olla.chat(
        MODEL, messages, format=schema, options={"temperature": 0, "num_predict": 60}
    )
    assert reply.message.content == text
    City.model_validate_json(reply.message.content)
    for seed in range(3):  # sampled answers keep to the schema too
        sampled = await olla.chat(
            MODEL,
            messages,
            format=schema,
            options={"temperature": 1, "seed": seed, "num_predict": 60},
        )
        City.model_validate_json(sampled.message.content)
    # "json": any object, constrained as json_object (unfinished at num_predict on this model)
    loose, _, _ = await engine_answer(
        engine, user(messages[0]["content"]), 12, GrammarSpec("json_object")
    )
    any_json = await olla.chat(
        MODEL, messages, format="json", options={"temperature": 0, "num_predict": 12}
    )
    assert any_json.message.content == loose and loose.startswith("{")


async def test_a_tool_call_and_its_result(olla, engine):
    ask = "What is the weather in Paris?"
    tools = json.dumps([WEATHER["function"]])
    prompt = ChatPrompt((ChatTurn("user", ask),), None, tools)
    text, _, _ = await engine_answer(engine, prompt, 40, call_grammar(WEATHER["function"]))
    expected = json.loads(text)
    messages = [{"role": "user", "content": ask}]
    options = {"temperature": 0, "num_predict": 40}
    reply = await olla.chat(MODEL, messages, tools=[WEATHER], format=CALL_FORMAT, options=options)
    [call] = reply.message.tool_calls
    assert call.function.name == "get_weather" == expected["name"]
    assert call.function.arguments == expected["arguments"]
    parts = [
        p
        async for p in await olla.chat(
            MODEL, messages, tools=[WEATHER], format=CALL_FORMAT, options=options, stream=True
        )
    ]
    streamed = [c for p in parts for c in p.message.tool_calls or ()]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (call.function.name, call.function.arguments)
    ]
    # The call's result, sent back: the conversation the engine answers.
    arguments = dict(call.function.arguments)
    back = [
        *messages,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": arguments}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    turns = (
        ChatTurn("user", ask),
        ChatTurn(
            "function", json.dumps([{"name": "get_weather", "arguments": json.dumps(arguments)}])
        ),
        ChatTurn("tool", "sunny"),
    )
    answer, _, _ = await engine_answer(engine, ChatPrompt(turns, None, tools))
    reply = await olla.chat(MODEL, back, tools=[WEATHER], options=GREEDY)
    assert reply.message.content == answer


async def test_embed_and_embeddings_are_the_engine_s_vectors(olla, engine):
    texts = ("hello world", "the sky is blue")
    result = await EngineClient(engine).embed(EmbedRequest(texts))
    reply = await olla.embed(MODEL, list(texts))
    assert reply.model == MODEL and reply.prompt_eval_count == result.n_tokens
    assert np.allclose(np.array(reply.embeddings), np.stack(result.vectors), atol=1e-6)
    older = await olla.embeddings(MODEL, texts[0])
    assert np.allclose(older.embedding, result.vectors[0], atol=1e-6)
    assert (await olla.embed(MODEL, [])).embeddings == []


async def test_tags_ps_show_and_version_describe_the_model(olla, server):
    [listed] = (await olla.list()).models
    assert listed.model == f"{MODEL}:latest" and listed.size > 100_000_000
    assert listed.details.format == "gguf" and listed.details.family == "gemma3"
    assert listed.details.quantization_level == "Q4_K_M" and listed.details.parameter_size == "270M"
    [loaded] = (await olla.ps()).models
    assert loaded.model == f"{MODEL}:latest" and loaded.size > 0
    assert loaded.expires_at.year > 2100  # --model alone never unloads
    shown = await olla.show(f"{MODEL}:latest")
    assert shown.modelinfo["general.architecture"] == "gemma3"
    assert shown.modelinfo["gemma3.context_length"] == 32768
    assert shown.modelinfo["tokenizer.ggml.tokens"] is None  # arrays, as Ollama leaves them
    assert "<start_of_turn>" in shown.template and "temperature" in shown.parameters
    assert "completion" in shown.capabilities
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{host(server)}/api/version") as resp:
            assert resp.status == 200 and "version" in await resp.json()
        async with http.head(f"{host(server)}/") as resp:  # Ollama's liveness check
            assert resp.status == 200
        async with http.get(f"{host(server)}/") as resp:  # the chat page stays
            assert resp.content_type == "text/html"


async def test_an_empty_request_loads_or_unloads_without_generating(olla):
    loaded = await olla.generate(MODEL)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    unloaded = await olla.generate(MODEL, keep_alive=0)
    assert unloaded.done_reason == "unload"
    chat_loaded = await olla.chat(MODEL, [])
    assert chat_loaded.done_reason == "load" and chat_loaded.message.content == ""


async def test_the_stream_is_ndjson(server):
    body = {"model": f"{MODEL}:latest", "prompt": ASK, "options": GREEDY}
    url = f"{host(server)}/api/generate"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        assert resp.status == 200 and resp.content_type == "application/x-ndjson"
        raw = await resp.read()
    lines = raw.decode().split("\n")
    assert lines[-1] == "" and all(
        json.loads(line)["model"] == f"{MODEL}:latest" for line in lines[:-1]
    )


async def refusal(work: Any) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as raised:
        await work
    return raised.value


async def test_errors_are_ollama_s(olla):
    messages = [{"role": "user", "content": ASK}]
    for call in (
        olla.chat("llama3", messages),
        olla.generate("llama3", ASK),
        olla.embed("llama3", "hi"),
        olla.show("llama3"),
    ):
        error = await refusal(call)
        assert (error.status_code, error.error) == (404, "model 'llama3' not found")
    error = await refusal(olla.chat(MODEL, messages, options={"temperature": "hot"}))
    assert (error.status_code, error.error) == (400, 'option "temperature" must be of type float32')
    error = await refusal(olla.chat(MODEL, messages, think=True))
    assert (error.status_code, error.error) == (400, f'"{MODEL}" does not support thinking')
    error = await refusal(olla.chat(MODEL, messages, options={"num_ctx": 0}))
    assert error.status_code == 400 and "num_ctx" in error.error
    error = await refusal(olla.pull(MODEL))
    assert error.status_code == 501 and "registry" in error.error and "/api/pull" in error.error
    error = await refusal(olla.delete(MODEL))
    assert error.status_code == 501 and "/api/delete" in error.error


async def test_an_oversized_body_and_a_wrong_method_are_ollama_s(make_server):
    server = await make_server(max_body_bytes=4096)
    async with aiohttp.ClientSession() as http:
        body = {"model": MODEL, "prompt": "x" * 8192}
        async with http.post(f"{host(server)}/api/generate", json=body) as resp:
            assert resp.status == 413 and set(await resp.json()) == {"error"}
        async with http.get(f"{host(server)}/api/chat") as resp:
            assert resp.status == 405 and set(await resp.json()) == {"error"}


async def test_head_is_ollama_s_liveness_check_with_or_without_the_page(make_server):
    for no_webui, page in ((False, 200), (True, 404)):
        server = await make_server(no_webui=no_webui)
        async with aiohttp.ClientSession() as http:
            async with http.head(f"{host(server)}/") as resp:
                assert resp.status == 200
            async with http.get(f"{host(server)}/") as resp:
                assert resp.status == page


async def test_images_reach_the_engine_as_media(aiohttp_server, vision_engine, settings):
    server = await aiohttp_server(create_app(settings, EngineClient(vision_engine)))
    image = image_bytes(7)
    question = "What is in this picture?"
    text, _, _ = await engine_answer(vision_engine, chat(image_turn("", image, question)), 6)
    client = ollama.AsyncClient(host=host(server), timeout=TIMEOUT_S)
    try:
        messages = [
            {"role": "user", "content": question, "images": [base64.b64encode(image).decode()]}
        ]
        reply = await client.chat(MODEL, messages, options={"temperature": 0, "num_predict": 6})
        assert reply.message.content == text
        made = await client.generate(
            MODEL, question, images=[image], options={"temperature": 0, "num_predict": 6}
        )
        assert made.response == text
    finally:
        await client._client.aclose()
