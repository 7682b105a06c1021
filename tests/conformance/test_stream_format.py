"""reference-api.md §7 byte format of a successful stream, with PRODUCT.md 3.1 divergence 4
(chunks carry `object` and `created`; the last finish_reason is the true one)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest

from tests.conformance.wire import (
    CHAT,
    EOS_BAN,
    EOS_NOW,
    USER,
    Reply,
    chat,
    post,
    reference_usage,
)

EVENT = re.compile(rb"data: ([^\n]*)\n\n|: ping - ([^\n]*)\n\n")
PING_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{6})?\+00:00")
ID = re.compile(r"chatcmpl-[0-9a-f]{32}")
CHUNK_KEYS = ["id", "object", "created", "model", "choices"]
MODEL = "my-org/módel ü"  # echoed verbatim, raw UTF-8


def split_events(body: bytes) -> tuple[list[bytes], list[str]]:
    """The body as a sequence of `data:` payloads and ping times; fails on any other byte."""
    payloads: list[bytes] = []
    pings: list[str] = []
    pos = 0
    while pos < len(body):
        match = EVENT.match(body, pos)
        assert match, f"not an SSE event at byte {pos}: {body[pos : pos + 80]!r}"
        if match.group(1) is not None:
            payloads.append(match.group(1))
        else:
            pings.append(match.group(2).decode())
        pos = match.end()
    return payloads, pings


def check_stream(reply: Reply, *, usage: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """Every framing rule of a successful stream; returns the chunks (no [DONE]) and pings."""
    assert reply.status == 200, reply.body
    assert reply.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert reply.headers["Cache-Control"] == "no-store"
    assert reply.headers["X-Accel-Buffering"] == "no"
    assert reply.headers["Transfer-Encoding"] == "chunked"
    assert "Content-Length" not in reply.headers
    assert reply.body.endswith(b"data: [DONE]\n\n")
    payloads, pings = split_events(reply.body)
    assert payloads[-1] == b"[DONE]" and b"[DONE]" not in payloads[:-1]
    chunks = []
    for payload in payloads[:-1]:
        chunk = json.loads(payload)
        # Python's json.dumps defaults: ", " and ": ", raw UTF-8, keys as sent.
        assert payload == json.dumps(chunk, ensure_ascii=False).encode()
        chunks.append(chunk)
    first = chunks[0]
    assert ID.fullmatch(first["id"])
    assert isinstance(first["created"], int)
    for chunk in chunks:
        assert list(chunk) == [*CHUNK_KEYS, "usage"] if "usage" in chunk else CHUNK_KEYS
        assert chunk["id"] == first["id"] and chunk["created"] == first["created"]
        assert chunk["object"] == "chat.completion.chunk"
    if usage:
        *chunks, last = chunks
        assert last["choices"] == []
        usage_numbers = reference_usage(last["usage"])
        assert usage_numbers["total_tokens"] == (
            usage_numbers["prompt_tokens"] + usage_numbers["completion_tokens"]
        )
    assert all("usage" not in chunk for chunk in chunks)
    for chunk in chunks:
        [choice] = chunk["choices"]
        assert list(choice) == ["index", "delta", "finish_reason"] and choice["index"] == 0
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    reasons = [chunk["choices"][0]["finish_reason"] for chunk in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(list(d) == ["content"] and d["content"] != "" for d in deltas[1:-1])
    assert deltas[-1] == {}
    assert reasons[:-1] == [None] * (len(chunks) - 1)
    assert reasons[-1] in ("stop", "length")
    if usage:
        return [*chunks, last], pings
    return chunks, pings


async def test_stream_bytes(make_client):
    client = await make_client(ping_interval_s=3600.0)
    before = int(time.time())
    reply = await post(client, CHAT, chat(USER, model=MODEL, stream=True, max_tokens=8))
    chunks, pings = check_stream(reply)
    assert before <= chunks[0]["created"] <= int(time.time())
    assert all(chunk["model"] == MODEL for chunk in chunks)
    assert MODEL.encode() in reply.body.split(b"\n\n")[0], "raw UTF-8, not \\u escapes"
    assert pings == []


async def test_stream_hits_max_tokens_finishes_with_length(client):
    body = chat(USER, stream=True, max_tokens=4, logit_bias=EOS_BAN)
    chunks, _ = check_stream(await post(client, CHAT, body))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len(chunks) <= 6


async def test_stream_stopped_by_eos_finishes_with_stop(client):
    body = chat(USER, stream=True, max_tokens=8, logit_bias=EOS_NOW)
    reply = await post(client, CHAT, body)
    chunks, _ = check_stream(reply)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert len(chunks) == 2, "no empty content deltas between the role and the finish"


async def test_stream_first_event_exact_bytes(client):
    reply = await post(client, CHAT, chat(USER, model="m", stream=True, max_tokens=1))
    chunks, _ = check_stream(reply)
    first = reply.body.split(b"\n\n")[0]
    assert first == (
        b'data: {"id": "' + chunks[0]["id"].encode() + b'", "object": "chat.completion.chunk", '
        b'"created": ' + str(chunks[0]["created"]).encode() + b', "model": "m", "choices": '
        b'[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}'
    )


@pytest.mark.parametrize("include", [True, False, None])
async def test_stream_options_include_usage(client, include):
    options = None if include is None else {"include_usage": include}
    body = chat(USER, stream=True, max_tokens=4, logit_bias=EOS_BAN, stream_options=options)
    reply = await post(client, CHAT, body)
    chunks, _ = check_stream(reply, usage=bool(include))
    if include:
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == 4
        plain = await post(client, CHAT, {**body, "stream": False, "stream_options": None})
        assert reference_usage(usage) == reference_usage(plain.json()["usage"])
        assert b'"choices": [], "usage": {"prompt_tokens": ' in reply.body
    else:
        assert b'"usage"' not in reply.body


async def test_keep_alive_ping(make_client):
    client = await make_client(ping_interval_s=0.01)
    body = chat(USER, stream=True, max_tokens=30, logit_bias=EOS_BAN)
    reply = await post(client, CHAT, body)
    chunks, pings = check_stream(reply)  # also: a ping never splits an event
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert pings, "a ping comment during a generation longer than the interval"
    for ping in pings:
        assert PING_TIME.fullmatch(ping), ping


@pytest.mark.parametrize("origin", [None, "http://app.example"])
async def test_stream_cors_headers(client, origin):
    headers = {} if origin is None else {"Origin": origin}
    body = chat(USER, stream=True, max_tokens=1)
    reply = await post(client, CHAT, body, headers=headers)
    check_stream(reply)
    assert reply.headers["Vary"] == "Origin"
    assert reply.headers.get("Access-Control-Allow-Origin") == origin
    assert reply.headers.get("Access-Control-Allow-Credentials") == (origin and "true")


async def raw_exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, connection: str
) -> tuple[bytes, list[bytes]]:
    """One HTTP/1.1 request on a raw socket; the response head and its chunks, as sent."""
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\n"
        b"Connection: " + connection.encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    chunks = []
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        data = await reader.readexactly(size + 2)
        assert data.endswith(b"\r\n")
        chunks.append(data[:-2])
        if size == 0:
            return head, chunks


@pytest.mark.parametrize("connection", ["keep-alive", "close"])
async def test_one_chunk_per_event_and_a_clean_end(make_client, connection):
    client = await make_client(ping_interval_s=3600.0)
    body = json.dumps(chat(USER, stream=True, max_tokens=4, logit_bias=EOS_BAN)).encode()
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        head, chunks = await raw_exchange(reader, writer, body, connection)
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0] == "HTTP/1.1 200 OK"
        headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
        assert headers["connection"] == connection
        assert headers["transfer-encoding"] == "chunked"
        assert "content-length" not in headers
        *events, end = chunks
        assert end == b"", "the terminating zero-length chunk"
        assert events[-1] == b"data: [DONE]\n\n"
        assert all(EVENT.fullmatch(event) for event in events), "one event per chunk"
        assert 4 <= len(events) <= 7  # role, up to 4 text deltas, finish, [DONE]
        if connection == "close":
            assert await reader.read() == b"", "the server closes as announced"
        else:
            head, chunks = await raw_exchange(reader, writer, body, connection)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n"), "the connection was reusable"
            assert chunks[-2:] == [b"data: [DONE]\n\n", b""]
    finally:
        writer.close()
