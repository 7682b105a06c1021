"""Helpers for byte-level assertions: send one request, read status, headers and raw body."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDictProxy

CHAT = "/v1/chat/completions"
SCORE = "/v1/score/evaluation"
MODELS = "/v1/models"
JSON = "application/json"

# EOS tokens of Gemma 3 (<eos>, <end_of_turn>, and the template's end marker): banning them makes
# a generation run to max_tokens; favouring <end_of_turn> ends it at once with "stop".
EOS_BAN = {"1": -100, "106": -100, "212": -100}
EOS_NOW = {"106": 100}

USER = {"role": "user", "content": "hi"}
ASSISTANT = {"role": "assistant", "content": "ok"}
SYSTEM = {"role": "system", "content": "be brief"}
TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}
# A 1x1 PNG, as a data URI (a valid image for the reference's decoder too).
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@dataclass(frozen=True)
class Reply:
    """One answer as the client saw it."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


def compact(value: Any) -> bytes:
    """JSON as the reference writes response bodies: no spaces, raw UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def detail(text: Any) -> bytes:
    """The exact bytes of an error body."""
    return compact({"detail": text})


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A chat body: model "m", the given messages (default one user turn), extra fields."""
    return {"model": "m", "messages": list(messages) if messages else [USER], **fields}


def media(url: str, kind: str = "image_url", role: str = "user") -> dict[str, Any]:
    """A message whose list content holds one text item and one media item."""
    return {
        "role": role,
        "content": [{"type": "text", "text": "see"}, {"type": kind, kind: {"url": url}}],
    }


async def send(
    client: Any,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    ctype: str | None = JSON,
    headers: dict[str, str] | None = None,
) -> Reply:
    """Send `body` as JSON (or `raw` bytes) with the given content type (None: no header)."""
    data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    all_headers = dict(headers or {})
    skip: list[str] = []
    if ctype is None:
        skip.append("Content-Type")
    else:
        all_headers["Content-Type"] = ctype
    async with client.request(
        method, path, data=data, headers=all_headers, skip_auto_headers=skip, allow_redirects=False
    ) as resp:
        return Reply(resp.status, resp.headers, await resp.read())


async def post(client: Any, path: str, body: Any, **kwargs: Any) -> Reply:
    """POST a JSON body."""
    return await send(client, "POST", path, body, **kwargs)


def assert_error(reply: Reply, status: int, body: bytes) -> None:
    """A JSON error: exact status, exact bytes, JSON content type and length."""
    assert (reply.status, reply.body) == (status, body), reply.body.decode("utf-8", "replace")
    assert reply.headers["Content-Type"] == JSON
    assert reply.headers["Content-Length"] == str(len(body))


def reference_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """The reference's three usage keys, in order; edgeserve may add `prompt_tokens_details`
    (OpenAI's field) after them when its prefix cache reused part of the prompt."""
    keys = list(usage)
    assert keys[:3] == ["prompt_tokens", "completion_tokens", "total_tokens"], keys
    if keys[3:]:
        assert keys[3:] == ["prompt_tokens_details"], keys
        assert 0 < usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]
    return {key: usage[key] for key in keys[:3]}
