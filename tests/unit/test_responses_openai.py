"""edgeserve.responses beyond the reference: tool-call answers (reference section 6's shape)
and OpenAI's legacy text completions, byte for byte."""

from __future__ import annotations

import json
import re

import pytest

from edgeserve.responses import (
    chat_completion_body,
    completion_body,
    completion_chunk,
    completion_usage_chunk,
    new_text_completion_id,
    new_tool_call_id,
)
from edgeserve.tool_calls import ToolCall

CID = "chatcmpl-5bcf7e062fa743d18529a8b40f6967d8"
XID = "cmpl-5bcf7e062fa743d18529a8b40f6967d8"
CALL_ID = re.compile(r"call_[0-9a-f]{32}")


def test_ids() -> None:
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", new_text_completion_id())
    assert CALL_ID.fullmatch(new_tool_call_id())
    assert new_tool_call_id() != new_tool_call_id()


def tool_body(choices: list[tuple[str, str]], calls: list[list[ToolCall] | None]) -> dict:
    raw = chat_completion_body(CID, "m", choices, 7, 3, None, created=1, tool_calls=calls)
    return json.loads(raw)


def test_tool_call_answer() -> None:
    calls = [ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("now", "{}")]
    body = tool_body([('{"name": ...}', "stop")], [calls])
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert list(message) == ["role", "content", "tool_calls"]
    assert message["role"] == "assistant" and message["content"] is None
    ids = [call.pop("id") for call in message["tool_calls"]]
    assert all(CALL_ID.fullmatch(i) for i in ids) and len(set(ids)) == 2
    assert message["tool_calls"] == [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]


def test_tool_calls_win_over_the_engine_finish_reason() -> None:
    body = tool_body([("x", "length")], [[ToolCall("now", "{}")]])
    assert body["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("none", [None, []], ids=["None", "empty list"])
def test_choices_without_calls_stay_text(none: list[ToolCall] | None) -> None:
    body = tool_body([("a", "stop"), ("b", "length")], [[ToolCall("now", "{}")], none])
    first, second = body["choices"]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] is None
    assert second == {
        "index": 1,
        "message": {"role": "assistant", "content": "b", "tool_calls": None},
        "finish_reason": "length",
    }


def test_tool_call_body_bytes() -> None:
    raw = chat_completion_body(
        CID, "m", [("t", "stop")], 7, 3, None, created=1, tool_calls=[[ToolCall("f", "{}")]]
    ).decode()
    raw = CALL_ID.sub("call_X", raw)
    assert raw == (
        '{"id":"chatcmpl-5bcf7e062fa743d18529a8b40f6967d8","object":"chat.completion",'
        '"created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant",'
        '"content":null,"tool_calls":[{"id":"call_X","type":"function","function":'
        '{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],'
        '"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}'
    )


def test_tool_calls_must_match_the_choices() -> None:
    with pytest.raises(ValueError):
        chat_completion_body(CID, "m", [("a", "stop")], 1, 1, None, tool_calls=[None, None])


def test_completion_body_bytes() -> None:
    raw = completion_body(
        XID, "m", [("Hello", "stop"), ("Hé", "length"), ("x", "abort")], 4, 6, created=1
    )
    assert raw.decode() == (
        '{"id":"cmpl-5bcf7e062fa743d18529a8b40f6967d8","object":"text_completion","created":1,'
        '"model":"m","choices":['
        '{"text":"Hello","index":0,"logprobs":null,"finish_reason":"stop"},'
        '{"text":"Hé","index":1,"logprobs":null,"finish_reason":"length"},'
        '{"text":"x","index":2,"logprobs":null,"finish_reason":"length"}],'
        '"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}'
    )


def test_completion_body_with_cached_tokens() -> None:
    body = json.loads(completion_body(XID, "m", [("a", "stop")], 4, 1, 3, created=1))
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}


HEAD = f'data: {{"id": "{XID}", "object": "text_completion", "created": 1, "model": "m", '


def test_completion_chunks() -> None:
    assert completion_chunk(XID, "m", 1, 2, "Hel").decode() == (
        HEAD + '"choices": [{"text": "Hel", "index": 2, "logprobs": null, '
        '"finish_reason": null}]}\n\n'
    )
    assert completion_chunk(XID, "m", 1, 0, "", "abort").decode() == (
        HEAD + '"choices": [{"text": "", "index": 0, "logprobs": null, '
        '"finish_reason": "length"}]}\n\n'
    )
    assert completion_usage_chunk(XID, "m", 1, 4, 2).decode() == (
        HEAD + '"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2, '
        '"total_tokens": 6}}\n\n'
    )
