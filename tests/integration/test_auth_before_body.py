"""The API key and the declared body size are decided from the headers: with a key set, no
byte of an unauthorised body is read (divergence 22), and a Content-Length over
--max-body-bytes is a 413 before any is. Each test sends the headers and only the first bytes
of a large body over a raw socket, then waits for the answer: a server that reads the body
first never answers, since the rest never comes."""

from __future__ import annotations

import asyncio
import json

import pytest

pytestmark = pytest.mark.needs_model

CHAT = "/v1/chat/completions"
# Long enough that a server waiting for the body would still be waiting.
ANSWER_WAIT_S = 20


async def _answer_to_partial_body(
    client, path: str, declared: int, headers: dict[str, str]
) -> tuple[int, dict]:
    """Send a POST declaring `declared` bytes, write only its first bytes, and read the
    response (status and JSON body) while the rest is never sent."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        lines = [
            f"POST {path} HTTP/1.1",
            f"Host: 127.0.0.1:{client.server.port}",
            "Content-Type: application/json",
            f"Content-Length: {declared}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + b"[{},{},{},")
        await writer.drain()
        async with asyncio.timeout(ANSWER_WAIT_S):
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length)
        return int(status_line.split()[1]), json.loads(body)
    finally:
        writer.close()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"x-api-key": "no"}])
async def test_an_unauthorised_body_is_never_read(make_client, headers):
    client = await make_client(api_keys=("k",))
    status, body = await _answer_to_partial_body(client, CHAT, 32 * 1024 * 1024, headers)
    assert (status, body["detail"]) == (401, "Invalid API key.")


async def test_a_declared_size_over_the_limit_is_413_before_reading(make_client):
    client = await make_client(api_keys=("k",), max_body_bytes=1024 * 1024)
    status, body = await _answer_to_partial_body(
        client, CHAT, 1024 * 1024 + 1, {"Authorization": "Bearer k"}
    )
    assert status == 413
    assert "1048576" in body["detail"]


async def test_a_declared_size_over_the_limit_is_413_without_a_key(make_client):
    client = await make_client(max_body_bytes=4096)
    status, _ = await _answer_to_partial_body(client, "/v1/score/evaluation", 4097, {})
    assert status == 413


async def test_an_authorised_body_is_read_and_answered(make_client):
    client = await make_client(api_keys=("k",))
    response = await client.post(
        CHAT,
        json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
        headers={"Authorization": "Bearer k"},
    )
    assert response.status == 200
