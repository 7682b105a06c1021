"""reference-api.md §1.4: the non-stream chat response, byte-level."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.conformance.wire import (
    CHAT,
    EOS_BAN,
    EOS_NOW,
    JSON,
    USER,
    chat,
    compact,
    post,
    reference_usage,
)

ID = re.compile(r"chatcmpl-[0-9a-f]{32}")


@pytest.mark.parametrize(
    ("model", "fields", "finish", "completion"),
    [
        pytest.param("m", {"max_tokens": 3, "logit_bias": EOS_BAN}, "length", 3, id="length"),
        pytest.param("gpt-4o", {"max_tokens": 8, "logit_bias": EOS_NOW}, "stop", 1, id="stop"),
        pytest.param(
            "my-org/módel ü",
            {"max_tokens": 2, "logit_bias": EOS_BAN},
            "length",
            2,
            id="non-ascii-model",
        ),
    ],
)
async def test_response_bytes(client, model, fields, finish, completion):
    before = int(time.time())
    reply = await post(client, CHAT, chat(USER, model=model, **fields))
    after = int(time.time())
    assert reply.status == 200, reply.body
    assert reply.headers["Content-Type"] == JSON
    assert reply.headers["Content-Length"] == str(len(reply.body))
    body = reply.json()
    assert reply.body == compact(body), "compact JSON, raw UTF-8"
    assert list(body) == ["id", "object", "created", "model", "choices", "usage"]
    assert ID.fullmatch(body["id"])
    assert body["object"] == "chat.completion"
    assert before <= body["created"] <= after
    assert body["model"] == model
    [choice] = body["choices"]
    assert list(choice) == ["index", "message", "finish_reason"]
    assert choice["index"] == 0 and choice["finish_reason"] == finish
    message = choice["message"]
    assert list(message) == ["role", "content", "tool_calls"]
    assert message["role"] == "assistant" and message["tool_calls"] is None
    assert isinstance(message["content"], str)
    assert b'"tool_calls":null},"finish_reason":' in reply.body
    usage = reference_usage(body["usage"])
    assert usage["completion_tokens"] == completion
    assert usage["prompt_tokens"] > 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if finish == "stop":
        assert message["content"] == ""


async def test_ids_are_fresh(client):
    body = chat(USER, max_tokens=1)
    first, second = [(await post(client, CHAT, body)).json()["id"] for _ in range(2)]
    assert first != second


async def test_n_choices_and_usage_arithmetic(client):
    body = chat(USER, max_tokens=2, n=3, logit_bias=EOS_BAN, seed=3)
    data = (await post(client, CHAT, body)).json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    assert [c["finish_reason"] for c in data["choices"]] == ["length"] * 3
    single = (await post(client, CHAT, {**body, "n": 1})).json()
    assert reference_usage(data["usage"]) == {
        "prompt_tokens": single["usage"]["prompt_tokens"],  # the prompt once, not per choice
        "completion_tokens": 6,  # summed over the choices
        "total_tokens": single["usage"]["prompt_tokens"] + 6,
    }


async def test_unknown_fields_are_ignored(client):
    extra = {"user": "u", "tool_choice": "auto", "frobnicate": {"x": [1]}, "logprobs": False}
    reply = await post(client, CHAT, chat(USER, max_tokens=1, **extra))
    assert reply.status == 200, reply.body


async def test_lax_coercions(client):
    reply = await post(client, CHAT, chat(USER, max_tokens="1", n=1.0, stream="false"))
    assert reply.status == 200, reply.body
    assert reply.headers["Content-Type"] == JSON
    assert json.loads(reply.body)["usage"]["completion_tokens"] == 1
