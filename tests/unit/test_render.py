"""api/*/render.py: exact bytes of every builder (reference-api.md sections 1.2, 1.4, 1.5,
7.2 with divergence 4, 7.3)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest

from edgeserve.api.common.openai_render import ping_comment, sse_event, stream_error_event
from edgeserve.api.common.tool_stream import CallArguments, CallStart, Content
from edgeserve.api.common.wire import Finish
from edgeserve.api.models.render import models_body
from edgeserve.api.openai_chat.render import (
    chat_completion_body,
    finish_chunk,
    new_completion_id,
    piece_chunks,
    role_chunk,
    usage_chunk,
)
from edgeserve.api.reference.errors import error_body, error_message
from edgeserve.api.score.render import new_score_id, score_body

CID = "chatcmpl-5bcf7e062fa743d18529a8b40f6967d8"
HEAD = f'{{"id": "{CID}", "object": "chat.completion.chunk", "created": 1796011736, "model": "m", '


def test_ids() -> None:
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", new_completion_id())
    assert re.fullmatch(r"scoreval-[0-9a-f]{32}", new_score_id())
    assert new_completion_id() != new_completion_id()


CHAT_BODIES = [
    (
        "reference example",
        [("Hello world", "stop")],
        (7, 3, None),
        '{"id":"chatcmpl-5bcf7e062fa743d18529a8b40f6967d8","object":"chat.completion",'
        '"created":1796011736,"model":"m","choices":[{"index":0,"message":{"role":"assistant",'
        '"content":"Hello world","tool_calls":null},"finish_reason":"stop"}],'
        '"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}',
    ),
    (
        "n=3, length and abort become length",
        [("a", "stop"), ("b", "length"), ("c", "abort")],
        (9, 12, None),
        '{"id":"chatcmpl-5bcf7e062fa743d18529a8b40f6967d8","object":"chat.completion",'
        '"created":1796011736,"model":"m","choices":['
        '{"index":0,"message":{"role":"assistant","content":"a","tool_calls":null},"finish_reason":"stop"},'
        '{"index":1,"message":{"role":"assistant","content":"b","tool_calls":null},"finish_reason":"length"},'
        '{"index":2,"message":{"role":"assistant","content":"c","tool_calls":null},"finish_reason":"length"}],'
        '"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}',
    ),
    (
        "raw UTF-8 and escapes",
        [('héllo "wörld"\n\t', "stop")],
        (1, 2, None),
        '{"id":"chatcmpl-5bcf7e062fa743d18529a8b40f6967d8","object":"chat.completion",'
        '"created":1796011736,"model":"m","choices":[{"index":0,"message":{"role":"assistant",'
        '"content":"héllo \\"wörld\\"\\n\\t","tool_calls":null},"finish_reason":"stop"}],'
        '"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}',
    ),
    (
        "cached tokens",
        [("x", "stop")],
        (7, 3, 5),
        '{"id":"chatcmpl-5bcf7e062fa743d18529a8b40f6967d8","object":"chat.completion",'
        '"created":1796011736,"model":"m","choices":[{"index":0,"message":{"role":"assistant",'
        '"content":"x","tool_calls":null},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,'
        '"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":5}}}',
    ),
    (
        "no choices",
        [],
        (0, 0, None),
        '{"id":"chatcmpl-5bcf7e062fa743d18529a8b40f6967d8","object":"chat.completion",'
        '"created":1796011736,"model":"m","choices":[],'
        '"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}',
    ),
]


@pytest.mark.parametrize(
    ("choices", "tokens", "expected"),
    [case[1:] for case in CHAT_BODIES],
    ids=[case[0] for case in CHAT_BODIES],
)
def test_chat_completion_body(
    choices: list[tuple[str, str]], tokens: tuple[int, int, int | None], expected: str
) -> None:
    body = chat_completion_body(CID, "m", choices, *tokens, created=1796011736)
    assert body == expected.encode()


def test_chat_completion_body_created_defaults_to_now() -> None:
    before = int(datetime.now(UTC).timestamp())
    created = json.loads(chat_completion_body(CID, "m", [("x", "stop")], 1, 1, None))["created"]
    assert before <= created <= before + 2


EVENTS = [
    (
        "role",
        role_chunk(CID, "m", 1796011736),
        HEAD + '"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, '
        '"finish_reason": null}]}',
    ),
    (
        "content",
        *piece_chunks(CID, "m", 1796011736, [Content("Hel")]),
        HEAD + '"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]}',
    ),
    (
        "content raw UTF-8, escaped newline",
        *piece_chunks(CID, "m", 1796011736, [Content("é\n")]),
        HEAD + '"choices": [{"index": 0, "delta": {"content": "é\\n"}, "finish_reason": null}]}',
    ),
    (
        "finish stop",
        finish_chunk(CID, "m", 1796011736, Finish.STOP),
        HEAD + '"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}',
    ),
    (
        "finish length",
        finish_chunk(CID, "m", 1796011736, Finish.LENGTH),
        HEAD + '"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}',
    ),
    (
        "finish tool calls",
        finish_chunk(CID, "m", 1796011736, Finish.TOOL),
        HEAD + '"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}',
    ),
    (
        "arguments piece",
        *piece_chunks(CID, "m", 1796011736, [CallArguments(1, '{"city": "é')]),
        HEAD + '"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": '
        '{"arguments": "{\\"city\\": \\"é"}}]}, "finish_reason": null}]}',
    ),
    (
        "usage",
        usage_chunk(CID, "m", 1796011736, 7, 3),
        HEAD + '"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, '
        '"total_tokens": 10}}',
    ),
    (
        "usage with cached tokens",
        usage_chunk(CID, "m", 1796011736, 7, 3, cached_tokens=4),
        HEAD + '"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, '
        '"total_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}}',
    ),
    ("done", sse_event("[DONE]"), "[DONE]"),
    (
        "error after the start",
        stream_error_event(503, "Server is busy"),
        '{"error": {"message": "Server is busy", "type": "server_error", "code": 503}}',
    ),
    (
        "error with a list detail",
        stream_error_event(400, [{"a": "é"}]),
        '{"error": {"message": "{\\"a\\": \\"é\\"}", "type": "server_error", "code": 400}}',
    ),
    ("plain payload", sse_event({"a": "é", "b": [1, None]}), '{"a": "é", "b": [1, null]}'),
]


@pytest.mark.parametrize(
    ("event", "payload"),
    [case[1:] for case in EVENTS],
    ids=[case[0] for case in EVENTS],
)
def test_sse_events(event: bytes, payload: str) -> None:
    assert event == f"data: {payload}\n\n".encode()


def test_a_call_starts_with_a_fresh_id_and_empty_arguments() -> None:
    pieces = [CallStart(2, "get_weather"), CallStart(3, "now")]
    chunks = piece_chunks(CID, "m", 1796011736, pieces)
    ids = [json.loads(chunk[6:])["choices"][0]["delta"]["tool_calls"][0]["id"] for chunk in chunks]
    assert all(re.fullmatch(r"call_[0-9a-f]{32}", call_id) for call_id in ids)
    assert ids[0] != ids[1]
    assert (
        chunks[0]
        == (
            f'data: {HEAD}"choices": [{{"index": 0, "delta": {{"tool_calls": [{{"index": 2, '
            f'"id": "{ids[0]}", "type": "function", "function": {{"name": "get_weather", '
            '"arguments": ""}}]}, "finish_reason": null}]}\n\n'
        ).encode()
    )


def test_role_chunk_size_matches_reference_plus_object_and_created() -> None:
    reference = (
        f'data: {{"id": "{CID}", "model": "m", "choices": [{{"index": 0, "delta": '
        '{"role": "assistant", "content": ""}, "finish_reason": null}]}\n\n'
    )
    assert len(reference.encode()) == 0xAA
    added = ', "object": "chat.completion.chunk", "created": 1796011736'
    assert len(role_chunk(CID, "m", 1796011736)) == 0xAA + len(added)


PINGS = [
    (
        "microseconds",
        datetime(2026, 11, 30, 4, 11, 11, 271683, tzinfo=UTC),
        b": ping - 2026-11-30 04:11:11.271683+00:00\n\n",
    ),
    (
        "whole second",
        datetime(2026, 11, 30, 4, 11, 11, tzinfo=UTC),
        b": ping - 2026-11-30 04:11:11+00:00\n\n",
    ),
]


@pytest.mark.parametrize(
    ("now", "expected"), [case[1:] for case in PINGS], ids=[case[0] for case in PINGS]
)
def test_ping_comment(now: datetime, expected: bytes) -> None:
    assert ping_comment(now) == expected


SCORES = [
    ("reference example", [0.5, 1.5], None, '"scores":[0.5,1.5]}'),
    ("pydantic-core floats", [1e-05, 1e16, -2.0], None, '"scores":[0.00001,1e+16,-2.0]}'),
    ("NaN and inf are null", [float("nan"), float("-inf")], None, '"scores":[null,null]}'),
    (
        "token logprobs when requested",
        [-1.25],
        [[-0.5, -2.0, float("-inf")]],
        '"scores":[-1.25],"token_logprobs":[[-0.5,-2.0,null]]}',
    ),
    ("empty token logprobs", [-1.0], [[]], '"scores":[-1.0],"token_logprobs":[[]]}'),
]


@pytest.mark.parametrize(
    ("scores", "token_logprobs", "tail"),
    [case[1:] for case in SCORES],
    ids=[case[0] for case in SCORES],
)
def test_score_body(
    scores: list[float], token_logprobs: list[list[float]] | None, tail: str
) -> None:
    sid = "scoreval-3682698f71374f558bcb4425a0d68df2"
    expected = f'{{"id":"{sid}","object":"score.evaluation","model":"rm",' + tail
    assert score_body(sid, "rm", scores, token_logprobs) == expected.encode()


def test_models_body() -> None:
    assert models_body("gpt-3.5-turbo", 1796011736) == (
        b'{"object":"list","data":[{"id":"gpt-3.5-turbo","object":"model",'
        b'"created":1796011736,"owned_by":"owner"}]}'
    )


ERRORS = [
    ("string", "Invalid role", b'{"detail":"Invalid role"}'),
    ("raw UTF-8", "Zürich", '{"detail":"Zürich"}'.encode()),
    (
        "list",
        [{"type": "missing", "loc": ["body"]}],
        b'{"detail":[{"type":"missing","loc":["body"]}]}',
    ),
    ("lone surrogate is escaped", json.loads('"a\\ud800é"'), b'{"detail":"a\\ud800\\u00e9"}'),
]


@pytest.mark.parametrize(
    ("detail", "expected"), [case[1:] for case in ERRORS], ids=[case[0] for case in ERRORS]
)
def test_reference_error_body(detail: object, expected: bytes) -> None:
    assert error_body(detail, with_message=False) == expected


@pytest.mark.parametrize(
    ("detail", "expected"), [case[1:] for case in ERRORS], ids=[case[0] for case in ERRORS]
)
def test_error_body_adds_the_message_after_the_detail(detail: object, expected: bytes) -> None:
    body = error_body(detail, with_message=True)
    assert body.startswith(expected[:-1] + b',"message":')
    assert json.loads(body) == {"detail": detail, "message": error_message(detail)}


def item(loc: list[object], msg: str, **extra: object) -> dict[str, object]:
    return {"type": "t", "loc": loc, "msg": msg, "input": None, **extra}


MESSAGES = [
    ("string is itself", "Invalid role", "Invalid role"),
    (
        "one item: dotted loc and msg",
        [item(["body", "messages", 0, "role"], "Input should be 'user'")],
        "body.messages.0.role: Input should be 'user'",
    ),
    (
        "the decoder's reason",
        [item(["body", 7], "JSON decode error", ctx={"error": "Expecting value"})],
        "body.7: JSON decode error (Expecting value)",
    ),
    (
        "a reason already in msg is not repeated",
        [item(["body", "n"], "Value error, bad n", ctx={"error": "bad n"})],
        "body.n: Value error, bad n",
    ),
    (
        "three items",
        [item(["body", f], "Field required") for f in ("a", "b", "c")],
        "body.a: Field required; body.b: Field required; body.c: Field required",
    ),
    (
        "more than three",
        [item(["body", f], "Field required") for f in "abcde"],
        "body.a: Field required; body.b: Field required; body.c: Field required; and 2 more errors",
    ),
    (
        "one more",
        [item(["body", f], "x") for f in "abcd"],
        "body.a: x; body.b: x; body.c: x; and 1 more error",
    ),
    ("an item of another shape", [{"a": "é"}], '{"a": "é"}'),
]


@pytest.mark.parametrize(
    ("detail", "expected"), [case[1:] for case in MESSAGES], ids=[case[0] for case in MESSAGES]
)
def test_error_message(detail: object, expected: str) -> None:
    assert error_message(detail) == expected
