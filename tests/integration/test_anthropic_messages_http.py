"""Anthropic's /v1/messages on the wire, on the real engine: the stream's event sequence as
bytes, errors in Anthropic's shape (schema errors, router errors, auth), and a client that goes
away mid-stream. tests/sdk/test_messages_sdk.py drives the same endpoints with the SDK."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.engine_idle import assert_engine_idle, assert_left_work_stops

MESSAGES = "/v1/messages"
ASK = [{"role": "user", "content": "Name three colours."}]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 6, "messages": ASK, "temperature": 0} | fields


def parse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in raw.decode().split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        name, data = lines
        assert name.startswith("event: ") and data.startswith("data: ")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


async def test_stream_event_sequence(client):
    resp = await client.post(MESSAGES, json=body(stream=True))
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = parse_events(await resp.read())
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert all(payload["type"] == name for name, payload in events)
    message = events[0][1]["message"]
    assert message["content"] == [] and message["usage"]["output_tokens"] == 0
    final = events[-2][1]
    assert final["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert 0 < final["usage"]["output_tokens"] <= 6


async def test_schema_errors_are_anthropic_400s(client):
    resp = await client.post(MESSAGES, json={"model": "m", "messages": ASK})
    assert resp.status == 400
    assert await resp.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "body.max_tokens: Field required"},
    }
    resp = await client.post(MESSAGES, data=b"{", headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_router_errors_have_anthropic_shape_on_its_paths(client):
    resp = await client.get(MESSAGES)
    assert resp.status == 405 and resp.headers["Allow"] == "POST"
    assert await resp.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "Method Not Allowed"},
    }
    chat = await client.get("/v1/chat/completions")
    assert (await chat.json())["detail"] == "Method Not Allowed"


async def test_auth_errors(make_client):
    client = await make_client(api_keys=("k",))
    resp = await client.post("/v1/messages/count_tokens", json={"model": "m", "messages": ASK})
    assert resp.status == 401
    assert (await resp.json())["error"] == {
        "type": "authentication_error",
        "message": "Invalid API key.",
    }
    ok = await client.post(
        "/v1/messages/count_tokens",
        json={"model": "m", "messages": ASK},
        headers={"x-api-key": "k"},
    )
    assert ok.status == 200 and (await ok.json())["input_tokens"] > 0
    models = await client.get("/v1/models", headers={"x-api-key": "k"})
    assert models.status == 200


def long_answer(**fields: Any) -> dict[str, Any]:
    """A request whose answer runs to max_tokens: Messages has no logit_bias to ban the end,
    so a forced call's schema makes the answer long: 25 lists of at least 25 numbers each
    (nested, so that the grammar stays small)."""
    row = {"type": "array", "items": {"type": "integer"}, "minItems": 25}
    rows = {"type": "array", "items": row, "minItems": 25}
    schema = {"type": "object", "properties": {"numbers": rows}, "required": ["numbers"]}
    return body(
        messages=[{"role": "user", "content": "Count."}],
        tools=[{"name": "count", "input_schema": schema}],
        tool_choice={"type": "tool", "name": "count"},
        max_tokens=1500,
        **fields,
    )


async def test_past_the_timeout_is_an_anthropic_timeout_error(make_client, engine):
    client = await make_client(request_timeout_s=0.001)
    resp = await client.post(MESSAGES, json=body(max_tokens=1000))
    assert resp.status == 504
    error = (await resp.json())["error"]
    assert error["type"] == "timeout_error" and "0.001 seconds" in error["message"]
    await assert_engine_idle(engine)


async def test_a_stream_past_the_timeout_ends_with_an_error_event(make_client, engine):
    # Long enough for the stream to start even on a busy machine; far too short for its tokens.
    client = await make_client(request_timeout_s=1.0)
    resp = await client.post(MESSAGES, json=long_answer(stream=True))
    assert resp.status == 200
    events = parse_events(await resp.read())
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert events[-1][1]["error"]["type"] == "timeout_error"
    await assert_engine_idle(engine)


async def test_disconnect_mid_stream_leaves_the_engine_idle(client, engine):
    resp = await client.post(MESSAGES, json=long_answer(stream=True))
    for _ in range(5):  # message_start, ping, the call's block start, two pieces of its input
        await resp.content.readuntil(b"\n\n")
    assert engine.stats().busy_slots == 1, "the call is still being generated"
    left_at = engine.stats().engine_steps
    resp.close()
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)
    again = await client.post(MESSAGES, json=body(max_tokens=2))
    assert (await again.json())["usage"]["output_tokens"] == 2
    await assert_engine_idle(engine)
