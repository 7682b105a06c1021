"""PRODUCT.md 3.1 divergence 7 over HTTP: every error body keeps the reference's `detail`
byte for byte and adds a top-level `message` (the detail text, or a one-line summary of a 422
list), which OpenAI's SDKs print; with --reference-errors (the setting the rest of this suite
runs with) the body is the reference's alone.

Each case is sent to both servers: the default body must be the reference body with
`,"message":…` added before its closing brace.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgeserve.engine.client import EngineClient
from tests.conformance.wire import ASSISTANT, CHAT, JSON, SCORE, USER, Reply, chat, send

ROLE_ENUM = "Input should be 'user', 'assistant', 'system', 'function' or 'tool'"
LONG_PROMPT = {"role": "user", "content": "word " * 3000}


def case(
    case_id: str,
    request: dict[str, Any],
    status: int,
    message: str,
    **overrides: Any,
) -> Any:
    """One error: how to provoke it (send() arguments), its status and its message (for a
    string `detail`, how the detail starts: the message must be the detail itself); `overrides`
    are settings of both servers."""
    return pytest.param(request, status, message, overrides, id=case_id)


CASES = [
    case(
        "422-schema",
        {"method": "POST", "path": CHAT, "body": chat({"role": "developer", "content": "hi"})},
        422,
        f"body.messages.0.role: {ROLE_ENUM}",
    ),
    case(
        "422-several-items",
        {"method": "POST", "path": CHAT, "body": {"messages": [{"role": "x"}], "n": None}},
        422,
        f"body.model: Field required; body.messages.0.role: {ROLE_ENUM}; "
        "body.n: Input should be a valid integer",
    ),
    case(
        "422-json-invalid",
        {"method": "POST", "path": CHAT, "raw": b'{"model": '},
        422,
        "body.10: JSON decode error (Expecting value)",
    ),
    case("422-empty-body", {"method": "POST", "path": SCORE}, 422, "body: Field required"),
    case(
        "400-reference",
        {"method": "POST", "path": CHAT, "body": chat(ASSISTANT)},
        400,
        "Invalid role",
    ),
    case(
        "400-unparsable-body",
        {"method": "POST", "path": CHAT, "raw": b'{"model": "\xff"}'},
        400,
        "There was an error parsing the body",
    ),
    case(
        "400-edgeserve",
        {"method": "POST", "path": CHAT, "body": chat(USER, n=0)},
        400,
        '"n" must be at least 1, got 0.',
    ),
    case(
        "400-engine-prompt-too-long",
        {"method": "POST", "path": CHAT, "body": chat(LONG_PROMPT, max_tokens=1)},
        400,
        "The prompt is",
    ),
    case(
        "401",
        {"method": "GET", "path": "/v1/models"},
        401,
        "Invalid API key.",
        api_keys=("k",),
    ),
    case("404", {"method": "GET", "path": "/v1/nope", "ctype": None}, 404, "Not Found"),
    case("405", {"method": "GET", "path": CHAT, "ctype": None}, 405, "Method Not Allowed"),
    case(
        "413",
        {"method": "POST", "path": CHAT, "body": chat({"role": "user", "content": "a" * 200})},
        413,
        "The request body is larger than this server's limit of 100 bytes; send a smaller request.",
        max_body_bytes=100,
    ),
]


async def both(make_client: Any, request: dict[str, Any], **overrides: Any) -> tuple[Reply, Reply]:
    """The reply of a default server, then of one with --reference-errors."""
    replies = []
    for reference_errors in (False, True):
        client = await make_client(reference_errors=reference_errors, **overrides)
        replies.append(await send(client, **request))
    return replies[0], replies[1]


@pytest.mark.parametrize(("request_", "status", "message", "overrides"), CASES)
async def test_error_bodies_add_a_message(make_client, request_, status, message, overrides):
    ours, reference = await both(make_client, request_, **overrides)
    assert (ours.status, reference.status) == (status, status)
    assert list(json.loads(reference.body)) == ["detail"]
    detail = json.loads(reference.body)["detail"]
    if isinstance(detail, str):
        assert detail.startswith(message)
        message = detail
    added = b',"message":' + json.dumps(message, ensure_ascii=False).encode() + b"}"
    assert ours.body == reference.body[:-1] + added, ours.body
    for reply in (ours, reference):
        assert reply.headers["Content-Type"] == JSON
        assert reply.headers["Content-Length"] == str(len(reply.body))
    assert ours.headers.get("Allow") == reference.headers.get("Allow")


async def test_not_allowed_adds_a_message(make_client, monkeypatch):
    # The capability flag is the only thing changed: the real engine answers nothing here.
    monkeypatch.setattr(EngineClient, "can_generate", property(lambda self: False))
    ours, reference = await both(make_client, {"method": "POST", "path": CHAT, "body": chat()})
    assert (ours.status, ours.body) == (405, b'{"detail":"Not allowed","message":"Not allowed"}')
    assert (reference.status, reference.body) == (405, b'{"detail":"Not allowed"}')
