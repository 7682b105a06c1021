"""What every OpenAI-shaped renderer shares: SSE framing, usage, finish reasons, token text.

Two JSON dialects, both the reference's: response bodies are compact pydantic-core JSON (raw
UTF-8, every field present, nulls included, declaration order), SSE chunks are Python
`json.dumps` with its default `", "`/`": "` separators and only the fields that were set.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime
from json.encoder import encode_basestring
from typing import Any

from edgeserve.api.common.wire import Finish, PromptTokensDetails, Usage
from edgeserve.api.reference.errors import error_message


def sse_event(payload: dict[str, Any] | str) -> bytes:
    """One SSE data event; a str payload (such as "[DONE]") is sent verbatim."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class TextEvent:
    """The SSE event of one streamed answer whose only varying part is a JSON string (a content
    delta): rendered once through `render` around a marker, then made per token by splicing
    the JSON-encoded text between the two halves. Byte for byte what `render(text)` gives (the
    chunk's JSON encodes a string the same wherever it sits), without building and dumping
    the chunk's models for every token."""

    def __init__(self, render: Callable[[str], bytes]) -> None:
        marker = f"edgeserve-text-{uuid.uuid4().hex}"
        head, found, tail = render(marker).partition(json.dumps(marker).encode())
        if not found or marker.encode() in tail:
            raise ValueError("the rendered event must hold the text exactly once")
        self._head = head
        self._tail = tail

    def __call__(self, text: str) -> bytes:
        """The event carrying `text`. `encode_basestring` is what `json.dumps(text,
        ensure_ascii=False)` calls for a str, without building an encoder each token."""
        return b"".join((self._head, encode_basestring(text).encode(), self._tail))


def ping_comment(now: datetime) -> bytes:
    """A keep-alive comment as sse-starlette >= 2.1 writes it."""
    return f": ping - {now}\n\n".encode()


def build_usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> Usage:
    """Token usage; prompt_tokens_details only when the cached count is known."""
    details = None if cached_tokens is None else PromptTokensDetails(cached_tokens=cached_tokens)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=details,
    )


def wire_finish_reason(engine_reason: str) -> Finish:
    """The engine's "stop" stays "stop"; anything else (length, abort) is "length"."""
    return Finish.STOP if engine_reason == "stop" else Finish.LENGTH


def token_text(token: bytes) -> str:
    """A token's bytes as text; bytes that are not whole UTF-8 characters (a token may hold
    part of one) are written as `\\xNN` escapes."""
    return token.decode("utf-8", errors="backslashreplace")


def stream_error_event(status: int, detail: Any) -> bytes:
    """An error after the stream started: one event in the OpenAI error shape (the SDK raises
    APIError on it), carrying the same message as a JSON error would."""
    message = error_message(detail)
    return sse_event({"error": {"message": message, "type": "server_error", "code": status}})


def new_tool_call_id() -> str:
    """`call_` + 32 lowercase hex digits, fresh for every call (reference section 6)."""
    return f"call_{uuid.uuid4().hex}"


def openai_stream_end(usage_event: bytes | None) -> list[bytes]:
    """The end of an OpenAI stream: the usage event (with stream_options.include_usage), then
    `[DONE]`."""
    return [*([usage_event] if usage_event else []), sse_event("[DONE]")]


def openai_stream_failure(status: int, detail: Any) -> list[bytes]:
    """An OpenAI stream ended by an error: the error event, then `[DONE]`."""
    return [stream_error_event(status, detail), sse_event("[DONE]")]
