"""POST /v1/responses over raw HTTP with the real model: the SSE framing (named events), the
error body, the request timeout inside a stream and a client that goes away."""

from __future__ import annotations

import json
from typing import Any

from edgeserve.api.reference.detail import Detail
from tests.integration.engine_idle import assert_engine_idle, assert_left_work_stops

RESPONSES = "/v1/responses"
COUNTING = {
    "model": "m",
    "input": "1, 2, 3, 4, 5, 6, 7, 8,",
    "temperature": 0,
    "max_output_tokens": 1500,
    "stream": True,
}


def named_events(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name, decoded data) per SSE block; pings skipped."""
    text = raw.decode()
    assert text.endswith("\n\n")
    found = []
    for block in text.split("\n\n")[:-1]:
        if block.startswith(":"):
            continue
        lines = block.split("\n")
        name = lines[0].removeprefix("event: ") if lines[0].startswith("event: ") else None
        assert lines[-1].startswith("data: ") and len(lines) == (2 if name else 1), block
        found.append((name, json.loads(lines[-1].removeprefix("data: "))))
    return found


async def test_stream_framing(client):
    body = {**COUNTING, "max_output_tokens": 4}
    resp = await client.post(RESPONSES, json=body)
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    found = named_events(await resp.read())
    assert all(name == data["type"] for name, data in found)
    assert found[-1][0] == "response.incomplete"


async def test_error_body(client):
    resp = await client.post(RESPONSES, json={"model": "m", "input": "hi", "store": True})
    assert resp.status == 400
    detail = Detail.STATELESS.format(field="store")
    assert await resp.json() == {"detail": detail, "message": detail}


async def test_stream_past_the_timeout_ends_with_an_error_event(make_client, engine):
    client = await make_client(request_timeout_s=1.0)
    resp = await client.post(RESPONSES, json=COUNTING)
    assert resp.status == 200
    found = named_events(await resp.read())
    detail = Detail.REQUEST_TIMEOUT.format(seconds=1.0)
    assert found[-1] == (None, {"error": {"message": detail, "type": "server_error", "code": 504}})
    assert any(name == "response.output_text.delta" for name, _ in found)
    await assert_engine_idle(engine)


async def test_a_client_that_goes_away_stops_the_generation(client, engine):
    resp = await client.post(RESPONSES, json=COUNTING)
    for _ in range(5):
        await resp.content.readuntil(b"\n\n")
    assert engine.stats().busy_slots == 1
    left_at = engine.stats().engine_steps
    resp.close()
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)
