"""api/openai_chat and api/openai_completions renderers beyond the reference: tool-call answers
(reference section 6's shape), OpenAI's legacy text completions and token log-probabilities, byte
for byte."""

from __future__ import annotations

import json
import re

import pytest

from edgeserve.api.common.logprobs import AlignedLogprob
from edgeserve.api.common.openai_render import new_tool_call_id
from edgeserve.api.common.tool_calls import ToolCall
from edgeserve.api.common.tool_stream import Content
from edgeserve.api.openai_chat.render import chat_completion_body, piece_chunks
from edgeserve.api.openai_completions.render import (
    completion_body,
    completion_chunk,
    completion_usage_chunk,
    new_text_completion_id,
)
from edgeserve.engine.types import TokenLogprob

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


# --- log-probabilities ------------------------------------------------------------------------

SAY = AlignedLogprob(TokenLogprob(0, b"Say", -0.5, ((b"Say", -0.5), (b"say", -2.25))), 0)
SPLIT = AlignedLogprob(TokenLogprob(0, b" \xc3", -1.0, ((b" \xc3", -1.0),)), 3)


def test_chat_body_with_logprobs_bytes() -> None:
    raw = chat_completion_body(
        CID, "m", [("Say é", "stop")], 7, 2, None, created=1, logprobs=[[SAY, SPLIT]]
    )
    assert raw.decode() == (
        '{"id":"chatcmpl-5bcf7e062fa743d18529a8b40f6967d8","object":"chat.completion",'
        '"created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant",'
        '"content":"Say é","tool_calls":null},"logprobs":{"content":['
        '{"token":"Say","logprob":-0.5,"bytes":[83,97,121],"top_logprobs":['
        '{"token":"Say","logprob":-0.5,"bytes":[83,97,121]},'
        '{"token":"say","logprob":-2.25,"bytes":[115,97,121]}]},'
        '{"token":" \\\\xc3","logprob":-1.0,"bytes":[32,195],"top_logprobs":['
        '{"token":" \\\\xc3","logprob":-1.0,"bytes":[32,195]}]}],"refusal":null},'
        '"finish_reason":"stop"}],'
        '"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}'
    )


def test_chat_logprobs_per_choice_and_with_tool_calls() -> None:
    raw = chat_completion_body(
        CID,
        "m",
        [("{}", "stop"), ("", "length")],
        7,
        2,
        None,
        created=1,
        tool_calls=[[ToolCall("f", "{}")], None],
        logprobs=[[SAY], []],
    )
    first, second = json.loads(raw)["choices"]
    assert first["finish_reason"] == "tool_calls"
    assert [e["token"] for e in first["logprobs"]["content"]] == ["Say"]
    assert second["logprobs"] == {"content": [], "refusal": None}


def test_chat_stream_chunk_with_logprobs() -> None:
    [chunk] = [c.decode() for c in piece_chunks(CID, "m", 1, [Content("Say")], logprobs=[SAY])]
    assert chunk == (
        f'data: {{"id": "{CID}", "object": "chat.completion.chunk", "created": 1, "model": "m", '
        '"choices": [{"index": 0, "delta": {"content": "Say"}, "logprobs": {"content": ['
        '{"token": "Say", "logprob": -0.5, "bytes": [83, 97, 121], "top_logprobs": ['
        '{"token": "Say", "logprob": -0.5, "bytes": [83, 97, 121]}, '
        '{"token": "say", "logprob": -2.25, "bytes": [115, 97, 121]}]}], "refusal": null}, '
        '"finish_reason": null}]}\n\n'
    )
    assert b"logprobs" not in piece_chunks(CID, "m", 1, [Content("Say")])[0]


def test_completion_body_with_logprobs() -> None:
    raw = completion_body(
        XID, "m", [("Say é", "stop"), ("", "length")], 4, 2, created=1, logprobs=[[SAY, SPLIT], []]
    )
    first, second = json.loads(raw)["choices"]
    assert first["logprobs"] == {
        "tokens": ["Say", " \\xc3"],
        "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"Say": -0.5, "say": -2.25}, {" \\xc3": -1.0}],
        "text_offset": [0, 3],
    }
    assert list(first) == ["text", "index", "logprobs", "finish_reason"]
    assert second["logprobs"] == {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }


def test_completion_chunk_with_logprobs() -> None:
    assert completion_chunk(XID, "m", 1, 0, "Say", None, [SAY]).decode() == (
        HEAD + '"choices": [{"text": "Say", "index": 0, "logprobs": {"tokens": ["Say"], '
        '"token_logprobs": [-0.5], "top_logprobs": [{"Say": -0.5, "say": -2.25}], '
        '"text_offset": [0]}, "finish_reason": null}]}\n\n'
    )


def test_completion_logprobs_of_an_unpredicted_first_token() -> None:
    """An echoed token prompt's first token: its text and offset, null value and alternatives."""
    first = AlignedLogprob(TokenLogprob(0, b"Once", None), 0)
    raw = completion_body(XID, "m", [("Once", "length")], 1, 0, created=1, logprobs=[[first]])
    assert raw.decode().count('"top_logprobs":[null]') == 1
    assert json.loads(raw)["choices"][0]["logprobs"] == {
        "tokens": ["Once"],
        "token_logprobs": [None],
        "top_logprobs": [None],
        "text_offset": [0],
    }
