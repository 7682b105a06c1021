"""Anthropic Messages, pure logic: a request's translation into chat's engine request
(api/anthropic_messages/translate.py: messages_prompt, prepare_messages, prepare_count_tokens),
the error types, and the answer and stream events built from engine results
(api/anthropic_messages/render.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgeserve.api.anthropic_messages import render as messages
from edgeserve.api.anthropic_messages.translate import (
    anthropic_error,
    messages_calls_wanted,
    messages_prompt,
    prepare_count_tokens,
    prepare_messages,
)
from edgeserve.api.anthropic_messages.wire import CountTokensRequest, MessagesRequest
from edgeserve.api.common.generating_api import ChoiceEnd, TokenUsage
from edgeserve.api.common.tool_calls import ToolCall
from edgeserve.api.common.tool_stream import CallArguments, CallStart, Content
from edgeserve.api.reference.limits import Limits
from edgeserve.api.reference.request import check_api_key
from edgeserve.engine.types import ChatPrompt, ChatTurn, Finished
from edgeserve.errors import ApiError

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOL = {"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


def request(messages_: list[dict[str, Any]], **fields: Any) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 16, "messages": messages_} | fields
    )


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def result(content: Any = "Sunny", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": "toolu_1", "content": content, **extra}


async def prompt_of(req: MessagesRequest | CountTokensRequest) -> ChatPrompt:
    return await (await messages_prompt(req, Limits())).read(Limits())


async def bad(req: MessagesRequest | CountTokensRequest, limits: Limits | None = None) -> str:
    with pytest.raises(ApiError) as caught:
        await prompt_of(req) if limits is None else await prepare_messages(req, limits)
    assert caught.value.status == 400
    return caught.value.detail


async def test_system_blocks_and_consecutive_turns_are_joined():
    req = request(
        [user("Hi."), user([{"type": "text", "text": "Weather?"}]), assistant("Sure."), user("Go")],
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
    )
    prompt = await prompt_of(req)
    assert prompt.system == "Be brief.\n\nBe kind."
    assert prompt.messages == (
        ChatTurn("user", "Hi.\n\nWeather?"),
        ChatTurn("assistant", "Sure."),
        ChatTurn("user", "Go"),
    )
    assert prompt.tools is None


async def test_tool_use_and_tool_result_become_chats_function_and_tool_turns():
    thinking = {"type": "thinking", "thinking": "hm", "signature": "s"}
    req = request(
        [
            user("Weather in Paris?"),
            assistant([thinking, {"type": "text", "text": "Let me look."}, USE]),
            user([result([{"type": "text", "text": "Sunny"}]), {"type": "text", "text": "And?"}]),
        ],
        tools=[TOOL],
    )
    prompt = await prompt_of(req)
    turns = prompt.messages
    calls = [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert turns[1] == ChatTurn("function", json.dumps(calls))
    assert turns[2] == ChatTurn("tool", "Sunny\n\nAnd?")
    tools = json.loads(prompt.tools)
    assert tools == [{"name": "get_weather", "parameters": SCHEMA, "description": "Weather"}]


async def test_an_error_result_says_so():
    req = request([user("Q"), assistant([USE]), user([result("no such city", is_error=True)])])
    assert (await prompt_of(req)).messages[2] == ChatTurn("tool", "Error: no such city")


@pytest.mark.parametrize(
    ("messages_", "says"),
    [
        ([], '"messages" is empty'),
        ([assistant("Hi"), user("Hi")], 'messages[0] has role "assistant"'),
        ([user("Hi"), assistant("Hello")], 'The last message has role "assistant"'),
        ([user("")], "messages[0] has no content"),
        ([user([])], "messages[0] has no content"),
        ([user([{"type": "text", "text": ""}])], "messages[0] has no content"),
        ([user("Q"), assistant([USE]), user([result() | {"tool_use_id": "x"}])], "answers "),
        ([user([result()])], "answers tool_use_id"),
        ([user([USE])], 'is a "tool_use" block in a message of role "user"'),
        (
            [user("Q"), assistant([result()]), user("A")],
            '"tool_result" block in a message of role "assistant"',
        ),
        ([user([{"type": "document", "source": {}}])], 'messages[0].content[0] is a "document"'),
        (
            [user("Q"), assistant([USE]), user([result([{"type": "document", "source": {}}])])],
            'messages[2].content[0] is a "document" block',
        ),
    ],
)
async def test_conversations_anthropic_refuses(messages_, says):
    assert says in await bad(request(messages_))


@pytest.mark.parametrize(
    ("choice", "forced", "wanted"),
    [
        (None, None, True),
        ({"type": "auto"}, None, True),
        ({"type": "none"}, None, False),
        ({"type": "any"}, [("get_weather", SCHEMA), ("other", {})], True),
        ({"type": "tool", "name": "other"}, [("other", {})], True),
    ],
)
async def test_tool_choice(choice, forced, wanted):
    other = {"name": "other", "input_schema": {}}
    req = request([user("Q")], tools=[TOOL, other], tool_choice=choice)
    assert (await messages_prompt(req, Limits())).forced == forced
    assert messages_calls_wanted(req) is wanted


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"tool_choice": {"type": "any"}}, '"tool_choice" has type "any" but the request has no'),
        ({"tools": [TOOL], "tool_choice": {"type": "tool"}}, 'type "tool" but no "name"'),
        (
            {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "x"}},
            'names the tool "x", which is not in "tools" ("get_weather")',
        ),
    ],
)
async def test_tool_choice_refused(fields, says):
    assert says in await bad(request([user("Q")], **fields))


async def test_sampling_and_the_forced_call_grammar():
    req = request(
        [user("Q")],
        stop_sequences=["\n\n", ""],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        tools=[TOOL],
        tool_choice={"type": "any"},
    )
    work = await prepare_messages(req, Limits())
    params = work.params
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (16, 0.5, 0.9, 40)
    assert params.stop == ("\n\n",)
    assert params.grammar is not None and "get_weather" in params.grammar.text
    plain = await prepare_messages(request([user("Q")], tools=[TOOL]), Limits())
    assert plain.params.grammar is None and plain.params.temperature == 1.0


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"max_tokens": 0}, '"max_tokens" must be at least 1, got 0.'),
        ({"max_tokens": 100}, '"max_tokens" is 100 but this server allows at most 64; lower it.'),
        ({"temperature": 1.5}, '"temperature" must be between 0.0 and 1.0, got 1.5.'),
        ({"top_p": -0.1}, '"top_p" must be between 0.0 and 1.0, got -0.1.'),
        ({"top_k": -1}, '"top_k" must be at least 0, got -1.'),
        ({"stop_sequences": ["\ud800"]}, "stop_sequences contains an unpaired UTF-16 surrogate"),
    ],
)
async def test_sampling_refused(fields, says):
    with pytest.raises(ApiError) as caught:
        await prepare_messages(request([user("Q")], **fields), Limits(max_tokens=64))
    assert caught.value.detail.startswith(says)


async def test_count_tokens_takes_the_same_conversation():
    body = {"model": "m", "messages": [user("Q")], "system": "S", "tools": [TOOL]}
    prompt = await prepare_count_tokens(CountTokensRequest.model_validate(body), Limits())
    assert prompt == await prompt_of(request([user("Q")], system="S", tools=[TOOL]))


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, (400, "invalid_request_error")),
        (422, (400, "invalid_request_error")),
        (401, (401, "authentication_error")),
        (403, (403, "permission_error")),
        (404, (404, "not_found_error")),
        (405, (405, "invalid_request_error")),
        (413, (413, "request_too_large")),
        (503, (503, "overloaded_error")),
        (504, (504, "timeout_error")),
        (500, (500, "api_error")),
    ],
)
def test_anthropic_error_types(status, expected):
    assert anthropic_error(ApiError(status, "x")) == expected


@pytest.mark.parametrize(
    ("authorization", "x_api_key", "ok"),
    [
        (None, "k", True),
        (None, " k ", True),
        ("Bearer k", None, True),
        ("Bearer wrong", "k", True),
        ("Bearer k", "wrong", True),
        (None, "wrong", False),
        (None, "", False),
        (None, None, False),
    ],
)
def test_the_key_may_come_in_x_api_key(authorization, x_api_key, ok):
    if ok:
        check_api_key(authorization, ["k"], x_api_key)
    else:
        with pytest.raises(ApiError):
            check_api_key(authorization, ["k"], x_api_key)


@pytest.mark.parametrize(
    ("finished", "called", "expected"),
    [
        (Finished(0, "stop", 3), False, ("end_turn", None)),
        (Finished(0, "stop", 3, stop_sequence="END"), False, ("stop_sequence", "END")),
        (Finished(0, "length", 3), False, ("max_tokens", None)),
        (Finished(0, "abort", 3), False, ("max_tokens", None)),
        (Finished(0, "stop", 3), True, ("tool_use", None)),
    ],
)
def test_stop_reason(finished, called, expected):
    assert messages.stop_reason(finished, called) == expected


def test_message_body_with_text_and_with_calls():
    finished = Finished(0, "stop", 5, cached_tokens=4)
    body = json.loads(messages.message_body("msg_1", "m", "Hello", None, finished, 10))
    assert body == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 6,
            "output_tokens": 5,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 4,
        },
    }
    calls = [ToolCall("get_weather", '{"city": "Paris"}')]
    body = json.loads(messages.message_body("msg_1", "m", "{...}", calls, finished, 10))
    [block] = body["content"]
    assert block["type"] == "tool_use" and block["input"] == {"city": "Paris"}
    assert block["id"].startswith("toolu_") and body["stop_reason"] == "tool_use"
    empty = json.loads(messages.message_body("msg_1", "m", "", None, finished, 10))
    assert empty["content"] == []
    action = "Action: f\nAction Input: 3"
    calls = [ToolCall("f", "3")]
    body = json.loads(messages.message_body("msg_1", "m", action, calls, finished, 10))
    assert body["content"] == [{"type": "text", "text": action}]
    assert body["stop_reason"] == "end_turn"


def events(data: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    parsed = []
    for item in data:
        head, body = item.decode().removesuffix("\n\n").split("\n")
        payload = json.loads(body.removeprefix("data: "))
        assert head == f"event: {payload['type']}"
        parsed.append((payload["type"], payload))
    return parsed


def test_stream_events_for_text_then_a_call_then_text():
    stream = messages.MessagesRenderer("m", 7)
    [(kind, start), ping] = events(stream.start())
    assert kind == "message_start" and ping == ("ping", {"type": "ping"})
    assert start["message"]["content"] == [] and start["message"]["stop_reason"] is None
    assert start["message"]["usage"]["input_tokens"] == 7
    pieces = [
        Content("Hi"),
        Content(""),
        Content(" there"),
        CallStart(0, "get_weather"),
        CallArguments(0, '{"city": '),
        CallArguments(0, '"Paris"}'),
        Content("after"),
    ]
    sent = events(stream.pieces(0, pieces, None))
    sent += events(
        stream.finish(ChoiceEnd(Finished(0, "stop", 9, cached_tokens=2), True, None), TokenUsage())
    )
    assert [kind for kind, _ in sent] == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert sent[0][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert sent[2][1]["delta"] == {"type": "text_delta", "text": " there"}
    call = sent[4][1]["content_block"]
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "get_weather", {})
    assert sent[5][1] == {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"city": '},
    }
    assert sent[8][1]["index"] == 2 and sent[10][1] == {"type": "content_block_stop", "index": 2}
    assert sent[11][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert sent[11][1]["usage"]["output_tokens"] == 9
    assert sent[11][1]["usage"]["input_tokens"] == 5


def test_a_stream_with_no_content_has_no_block():
    stream = messages.MessagesRenderer("m", 7)
    sent = events(stream.finish(ChoiceEnd(Finished(0, "length", 0), False, None), TokenUsage()))
    assert [kind for kind, _ in sent] == ["message_delta", "message_stop"]
    assert sent[0][1]["delta"]["stop_reason"] == "max_tokens"


def test_anthropic_error_body():
    body = messages.error_body("invalid_request_error", "No \ud800")
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "No \ud800"},
    }
