"""reference-api.md §2: which error wins when a request has several faults.

Each row: settings overrides, request (path, raw body or JSON, content type, headers), and the
one expected answer. Auth rows use the key "k".
"""

from __future__ import annotations

from typing import Any

import pytest

from edgeserve.engine.client import EngineClient
from tests.conformance.wire import (
    ASSISTANT,
    CHAT,
    JSON,
    PNG,
    SCORE,
    TOOL,
    USER,
    assert_error,
    chat,
    detail,
    media,
    send,
)

KEY = {"api_keys": ("k",)}
GOOD = {"Authorization": "Bearer k"}
BAD = {"Authorization": "Bearer nope"}
E9 = "Invalid URL: 400: Only HTTP/HTTPS URLs are allowed."
MISSING_MESSAGES = [
    {
        "type": "missing",
        "loc": ["body", "messages"],
        "msg": "Field required",
        "input": {"model": "m"},
    }
]
JSON_INVALID = [
    {
        "type": "json_invalid",
        "loc": ["body", 1],
        "msg": "JSON decode error",
        "input": {},
        "ctx": {"error": "Expecting property name enclosed in double quotes"},
    }
]
TEXT_ONLY = (
    "messages[0].content[0] is an image, but this server's model takes text only; start it "
    "with --mmproj PROJECTOR.gguf (the model's multimodal projector) to send images, or send "
    "text content only."
)
NULL_CONTENT = (
    "messages[0].content is null; give the message a content string "
    "(only an assistant message with tool_calls may omit it)."
)
NO_FUNCTION = (
    'tools[0] has no "function"; give each tool a "function" object with '
    '"name" and "parameters" (and optionally "description").'
)
IMAGE_ONLY = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}
NULL_USER = {"role": "user", "content": None}


def row(
    id: str,
    body: Any,
    status: int,
    expected: Any,
    *,
    path: str = CHAT,
    settings: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    ctype: str | None = JSON,
    method: str = "POST",
) -> Any:
    return pytest.param(settings or {}, method, path, body, ctype, headers, status, expected, id=id)


PRECEDENCE = [
    # step 1 (routing) before everything
    row("404-before-401", {}, 404, "Not Found", path="/v1/nope", settings=KEY),
    row("405-before-401", None, 405, "Method Not Allowed", method="GET", settings=KEY),
    row("405-before-422", b"{bad", 405, "Method Not Allowed", method="PUT", settings=KEY),
    # step 2 (decode): without a key, as the reference; with one, the key is decided from the
    # headers before any byte of the body is read (divergence 22)
    row("422-json-without-key", b"{bad", 422, JSON_INVALID),
    row("400-utf8-without-key", b'{"model":"\xff"}', 400, "There was an error parsing the body"),
    row("401-before-json", b"{bad", 401, "Invalid API key.", settings=KEY),
    row("401-before-json-wrong-key", b"{bad", 401, "Invalid API key.", settings=KEY, headers=BAD),
    row("401-before-json-score", b"{bad", 401, "Invalid API key.", path=SCORE, settings=KEY),
    row("401-before-utf8", b'{"model":"\xff"}', 401, "Invalid API key.", settings=KEY),
    row("key-then-422-json", b"{bad", 422, JSON_INVALID, settings=KEY, headers=GOOD),
    # step 3 (auth) before schema validation
    row("401-before-422-missing", {"model": "m"}, 401, "Invalid API key.", settings=KEY),
    row("401-before-422-score", {"model": "m"}, 401, "Invalid API key.", path=SCORE, settings=KEY),
    row("401-before-422-empty", b"", 401, "Invalid API key.", settings=KEY),
    row("401-before-422-text", b"x", 401, "Invalid API key.", settings=KEY, ctype="text/plain"),
    row("401-before-400", chat(messages=[]), 401, "Invalid API key.", settings=KEY, headers=BAD),
    row(
        "401-before-400-score",
        {"model": "m", "messages": []},
        401,
        "Invalid API key.",
        path=SCORE,
        settings=KEY,
    ),
    row("key-then-422", {"model": "m"}, 422, MISSING_MESSAGES, settings=KEY, headers=GOOD),
    row(
        "key-then-400-score",
        {"model": "m", "messages": []},
        400,
        "Invalid request",
        path=SCORE,
        settings=KEY,
        headers=GOOD,
    ),
    # step 7: _process_request in order
    row(
        "E3-before-everything",
        chat(messages=[], stream=True, tools=[TOOL], n=2),
        400,
        "Invalid length",
    ),
    row(
        "E4-before-role-and-media",
        chat(media("ftp://x/y"), ASSISTANT),
        400,
        "Only supports u/a/u/a/u...",
    ),
    row("media-msg0-before-role-msg1", chat(media("ftp://x/y"), USER, USER), 400, E9),
    row(
        "role-msg0-before-media-msg0",
        chat(media("ftp://x/y", role="assistant")),
        400,
        "Invalid role",
    ),
    row("role-msg1-before-media-msg2", chat(USER, USER, media("ftp://x/y")), 400, "Invalid role"),
    row(
        "media-before-tools-entry", chat(media("ftp://x/y"), tools=[{"type": "function"}]), 400, E9
    ),
    # step 8: stream checks after step 7 (tools stream: divergence 6, so only n is checked)
    row(
        "S2-n-with-tools",
        chat(USER, stream=True, tools=[TOOL], n=2),
        400,
        "Cannot stream multiple responses.",
    ),
    row("S2-n", chat(USER, stream=True, n=2), 400, "Cannot stream multiple responses."),
    row("S2-n-huge", chat(USER, stream=True, n=10**6), 400, "Cannot stream multiple responses."),
    row("E5-before-S2", chat(ASSISTANT, stream=True, tools=[TOOL], n=2), 400, "Invalid role"),
    row("E9-before-S2", chat(media("ftp://x/y"), stream=True, tools=[TOOL], n=2), 400, E9),
    row(
        "tools-entry-before-S2",
        chat(USER, stream=True, tools=[{"type": "function"}], n=2),
        400,
        NO_FUNCTION,
    ),
    # edgeserve's own 400s (which replace the reference's engine 500s) come last
    row("E5-before-null-content", chat(NULL_USER, USER, USER), 400, "Invalid role"),
    row("E9-before-null-content", chat(NULL_USER, ASSISTANT, media("ftp://x/y")), 400, E9),
    row(
        "S2-before-null-content",
        chat(NULL_USER, stream=True, n=2),
        400,
        "Cannot stream multiple responses.",
    ),
    row(
        "S2-before-text-only-media",
        chat(IMAGE_ONLY, stream=True, tools=[TOOL], n=2),
        400,
        "Cannot stream multiple responses.",
    ),
    row("E5-before-text-only-media", chat(IMAGE_ONLY, USER, USER), 400, "Invalid role"),
    row("text-only-media-before-n", chat(IMAGE_ONLY, n=0), 400, TEXT_ONLY),
    row("null-content-before-sampling", chat(NULL_USER, temperature=-1), 400, NULL_CONTENT),
]


@pytest.mark.parametrize(
    ("overrides", "method", "path", "body", "ctype", "headers", "status", "expected"), PRECEDENCE
)
async def test_precedence(
    make_client, overrides, method, path, body, ctype, headers, status, expected
):
    client = await make_client(**overrides)
    if isinstance(body, bytes) or body is None:
        reply = await send(client, method, path, raw=body or b"", ctype=ctype, headers=headers)
    else:
        reply = await send(client, method, path, body, ctype=ctype, headers=headers)
    assert_error(reply, status, detail(expected))


NOT_ALLOWED = [
    # (settings, path, body, headers, status, expected): the 405 "Not allowed" gate of §1.6
    pytest.param({}, chat(messages=[]), None, 405, "Not allowed", id="405-before-E3"),
    pytest.param({}, chat(ASSISTANT), None, 405, "Not allowed", id="405-before-E5"),
    pytest.param(
        {}, chat(USER, stream=True, tools=[TOOL], n=2), None, 405, "Not allowed", id="405-before-S2"
    ),
    pytest.param({}, {"model": "m"}, None, 422, MISSING_MESSAGES, id="422-before-405"),
    pytest.param(KEY, chat(USER), None, 401, "Invalid API key.", id="401-before-405"),
    pytest.param(KEY, chat(USER), GOOD, 405, "Not allowed", id="key-then-405"),
]


@pytest.mark.parametrize(("overrides", "body", "headers", "status", "expected"), NOT_ALLOWED)
async def test_not_allowed_gate(
    make_client, monkeypatch, overrides, body, headers, status, expected
):
    monkeypatch.setattr(EngineClient, "can_generate", property(lambda self: False))
    client = await make_client(**overrides)
    reply = await send(client, "POST", CHAT, body, headers=headers)
    assert_error(reply, status, detail(expected))
