"""Constrained output and log-probabilities over raw HTTP, with the real default model: how
log-prob entries line up with text that stop strings hold back or cut, the legacy completion
stream with several prompts and choices, and grammars that must compile in llama.cpp."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgeserve.grammars import MAX_REPEAT
from tests.integration.conftest import EOS_BAN
from tests.integration.sse_client import parse_events
from tests.sdk.schema_check import problems

CHAT = "/v1/chat/completions"
CATS = [{"role": "user", "content": "Write one short sentence about cats."}]
GREEDY = {
    "model": "m",
    "messages": CATS,
    "max_tokens": 8,
    "temperature": 0,
    "logit_bias": EOS_BAN,
    "logprobs": True,
}


async def post_json(client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def post_stream(client: Any, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    resp = await client.post(path, json={**body, "stream": True})
    assert resp.status == 200, await resp.text()
    events, done = parse_events(await resp.read())
    assert done
    return events


def token_bytes(entries: list[dict[str, Any]]) -> list[bytes]:
    return [bytes(entry["bytes"]) for entry in entries]


def flat(chunks: list[list[bytes]]) -> list[bytes]:
    return [token for chunk in chunks for token in chunk]


def covered(tokens: list[bytes], released: int) -> list[bytes]:
    """The alignment rule: the leading tokens whose bytes end within `released` bytes."""
    out, end = [], 0
    for token in tokens:
        end += len(token)
        if end > released:
            break
        out.append(token)
    return out


async def baseline(client: Any) -> tuple[str, list[bytes]]:
    """The greedy answer and its tokens. Asked twice, so that this answer and the next
    request both decode after the same prefix-cache hit (the same arithmetic, the same
    tokens)."""
    await post_json(client, CHAT, GREEDY)
    body = await post_json(client, CHAT, GREEDY)
    [choice] = body["choices"]
    tokens = token_bytes(choice["logprobs"]["content"])
    assert b"".join(tokens) == choice["message"]["content"].encode()
    return choice["message"]["content"], tokens


def cut_inside_a_token(tokens: list[bytes]) -> int:
    """A byte position inside the first multi-byte token after the first one."""
    start = len(tokens[0])
    for token in tokens[1:]:
        if len(token) >= 2:
            return start + 1
        start += len(token)
    raise AssertionError(f"no token of two bytes or more in {tokens}")


async def test_a_stop_string_drops_the_entry_of_the_token_it_cuts(client):
    content, tokens = await baseline(client)
    cut = cut_inside_a_token(tokens)
    stop = content.encode()[cut:].decode()
    body = await post_json(client, CHAT, {**GREEDY, "stop": [stop]})
    [choice] = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == content.encode()[:cut].decode()
    kept = token_bytes(choice["logprobs"]["content"])
    assert kept == covered(tokens, cut)
    assert len(kept) < body["usage"]["completion_tokens"]


async def stream_with_stop(
    client: Any, stop: str, tokens: list[bytes]
) -> tuple[bytes, list[list[bytes]], str]:
    """Stream the greedy answer with `stop`; check that every chunk carries the entries of
    the tokens its text completes. Returns the text, each chunk's tokens, the finish reason."""
    events = await post_stream(client, CHAT, {**GREEDY, "stop": [stop]})
    released, chunks = b"", []
    for event in events[1:-1]:
        [choice] = event["choices"]
        released += choice["delta"]["content"].encode()
        chunks.append(token_bytes(choice["logprobs"]["content"]))
        assert flat(chunks) == covered(tokens, len(released))
    [last] = events[-1]["choices"]
    assert "logprobs" not in last
    return released, chunks, last["finish_reason"]


async def test_stream_entries_of_text_cut_by_a_stop_string(client):
    content, tokens = await baseline(client)
    cut = cut_inside_a_token(tokens)
    stop = content.encode()[cut:].decode()
    released, chunks, finish = await stream_with_stop(client, stop, tokens)
    assert (released, finish) == (content.encode()[:cut], "stop")
    assert flat(chunks) == covered(tokens, cut)


async def test_stream_entries_of_text_held_back(client):
    content, tokens = await baseline(client)
    stop = tokens[2].decode() + "\u0001"
    released, chunks, finish = await stream_with_stop(client, stop, tokens)
    assert (released, finish) == (content.encode(), "length")
    assert flat(chunks) == tokens
    assert tokens[2:4] in chunks, "the held-back token comes with the next one"


async def test_no_logprobs_key_unless_asked(client):
    fields = {**GREEDY, "logprobs": False, "max_tokens": 3}
    body = await post_json(client, CHAT, fields)
    assert list(body["choices"][0]) == ["index", "message", "finish_reason"]
    events = await post_stream(client, CHAT, fields)
    assert not any("logprobs" in event["choices"][0] for event in events)


async def test_completion_stream_of_several_prompts_and_choices(client):
    request = {
        "model": "m",
        "prompt": ["Red", "Blue"],
        "n": 2,
        "max_tokens": 3,
        "seed": 9,
        "logit_bias": EOS_BAN,
        "logprobs": 2,
    }
    events = await post_stream(client, "/v1/completions", request)
    texts: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    offsets: dict[int, list[int]] = {}
    for event in events:
        [choice] = event["choices"]
        index, logprobs = choice["index"], choice["logprobs"]
        assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"])
        assert len(logprobs["top_logprobs"]) == len(logprobs["tokens"])
        texts[index] = texts.get(index, "") + choice["text"]
        tokens.setdefault(index, []).extend(logprobs["tokens"])
        offsets.setdefault(index, []).extend(logprobs["text_offset"])
    assert sorted(texts) == [0, 1, 2, 3]
    for index, text in texts.items():
        assert len(tokens[index]) == 3 and "".join(tokens[index]) == text
        assert offsets[index] == [len("".join(tokens[index][:i])) for i in range(3)]


async def test_a_schema_at_the_repetition_limit_compiles(client):
    schema = {"type": "string", "maxLength": MAX_REPEAT}
    fields = {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    body = await post_json(client, CHAT, {**GREEDY, "max_tokens": 2, **fields})
    assert body["choices"][0]["message"]["content"].startswith('"')


UNIT = {
    "type": "function",
    "function": {
        "name": "convert",
        "description": "Convert a temperature",
        "parameters": {
            "type": "object",
            "$defs": {"Unit": {"type": "string", "enum": ["C", "F"]}},
            "properties": {"to": {"$ref": "#/$defs/Unit"}},
            "required": ["to"],
        },
    },
}


async def test_a_forced_call_follows_parameters_with_local_refs(client):
    body = await post_json(
        client,
        CHAT,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Convert 20 C to F."}],
            "tools": [UNIT],
            "tool_choice": "required",
            "max_tokens": 40,
            "temperature": 0,
        },
    )
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls", choice["message"]
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "convert"
    assert json.loads(call["function"]["arguments"])["to"] in ("C", "F")


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"schema": {"type": "boolean"}}},
    ],
    ids=["json_object", "json_schema"],
)
async def test_tools_and_a_format_compile_as_one_grammar(client, response_format):
    body = await post_json(
        client,
        CHAT,
        {**GREEDY, "tools": [UNIT], "response_format": response_format, "max_tokens": 2},
    )
    content = body["choices"][0]["message"]["content"]
    assert content[:1] in ("{", "t", "f"), content


async def test_a_grammar_answer_keeps_its_logprobs(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    body = await post_json(
        client,
        CHAT,
        {
            **GREEDY,
            "logit_bias": {},
            "max_tokens": 24,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        },
    )
    [choice] = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert problems(json.loads(choice["message"]["content"]), schema) == []
    entries = choice["logprobs"]["content"]
    assert b"".join(token_bytes(entries)) == choice["message"]["content"].encode()


@pytest.mark.parametrize(
    "value",
    ['say "hi"', "back\\slash", "two\nlines", "nul\x00byte", "São", "\ud800"],
    ids=["quote", "backslash", "newline", "U+0000", "non-ASCII", "lone surrogate escape"],
)
async def test_constants_come_out_as_valid_json(client, value):
    """Characters that need escaping in JSON or GBNF; U+0000 used to abort the server."""
    schema = {"type": "object", "properties": {"v": {"const": value}}, "required": ["v"]}
    body = await post_json(
        client,
        CHAT,
        {
            **GREEDY,
            "logit_bias": {},
            "max_tokens": 24,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        },
    )
    [choice] = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["content"]) == {"v": value}


async def test_a_forced_call_of_a_function_with_an_odd_name(client):
    tool = {"type": "function", "function": {**UNIT["function"], "name": 'to "F"\\'}}
    body = await post_json(
        client,
        CHAT,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Convert 20 C."}],
            "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": 'to "F"\\'}},
            "max_tokens": 40,
            "temperature": 0,
        },
    )
    [call] = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == 'to "F"\\'
