"""Fuzzing the whole server over HTTP: a real `edgeserve serve` process (tests/fuzz/conftest.py)
gets mutated bodies of every endpoint, JSON schemas as response formats and tool parameters
(compiled into llama.cpp grammars and sampled from), damaged images in every API's image
field, damaged audio files in chat's audio items (the server's projector hears too), and odd
methods, paths and headers. No request may get a 5xx, a response that is not
JSON (or a stream whose events are not), or no answer; the log may show no traceback or
unhandled error; and the process must stay alive."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from tests.fuzz.bodies import BODIES
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.json_strategies import corrupted, mutated, pick, to_json
from tests.fuzz.sample_images import sample_images
from tests.fuzz.schema_strategies import schemas
from tests.fuzz.server import Answer, FuzzServer
from tests.unit.test_audio_header import audio_like

pytestmark = pytest.mark.needs_model

CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "application/problem+json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "",
]
MIME_BY_SEED = {"png": "png", "jpeg": "jpeg", "gif": "gif", "bmp": "bmp", "webp": "webp"}
TOKEN_LIMITS = {
    "/v1/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
    "/v1/messages": "max_tokens",
}
OTHER_PATHS = [
    "/",
    "/health",
    "/metrics",
    "/v1/models",
    "/tokenizer_info",
    "/v1/chat/completions/",
    "/v1/x",
    "//v1/models",
    "/v1/messages/x",
]


@st.composite
def mutated_requests(draw: st.DrawFn) -> tuple[str, str, bytes, dict[str, str]]:
    """A mutated valid body, sometimes with its bytes corrupted. A generating body whose
    mutations dropped its token limit gets one back: without it the answer fills the context
    (8 s a request here); with a larger one the server refuses it (--max-tokens-cap)."""
    path = draw(st.sampled_from(sorted(BODIES)))
    doc = draw(mutated(BODIES[path]))
    field = TOKEN_LIMITS.get(path)
    if field and isinstance(doc, dict) and field not in doc and "max_completion_tokens" not in doc:
        doc[field] = 4
    body = draw(corrupted(to_json(doc).encode()))
    content_type = draw(st.sampled_from(CONTENT_TYPES[:2] * 4 + CONTENT_TYPES))
    return "POST", path, body, {"Content-Type": content_type} if content_type else {}


@st.composite
def schema_requests(draw: st.DrawFn) -> tuple[str, str, bytes, dict[str, str]]:
    """A response format or a tool's parameters from the schema strategy, in chat, Responses
    or Messages; a forced call or a format makes the server compile and sample a grammar."""
    schema = draw(schemas())
    api = draw(st.sampled_from(["chat-format", "chat-tool", "responses-format", "messages-tool"]))
    tokens = draw(st.integers(1, 6))
    if api == "chat-format":
        path = "/v1/chat/completions"
        body: dict[str, Any] = {
            "model": "m",
            "messages": [{"role": "user", "content": "answer"}],
            "max_tokens": tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            },
        }
    elif api == "chat-tool":
        path = "/v1/chat/completions"
        tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
        choice = draw(
            st.sampled_from(["required", "auto", {"type": "function", "function": {"name": "f"}}])
        )
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "call"}],
            "max_tokens": tokens,
            "tools": [tool],
            "tool_choice": choice,
        }
    elif api == "responses-format":
        path = "/v1/responses"
        body = {
            "model": "m",
            "input": "answer",
            "max_output_tokens": tokens,
            "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}},
        }
    else:
        path = "/v1/messages"
        tool = {"name": "f", "input_schema": schema}
        body = {
            "model": "m",
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": "call"}],
            "tools": [tool],
            "tool_choice": {"type": "any"},
        }
    body["stream"] = draw(st.booleans())
    return "POST", path, to_json(body).encode(), {"Content-Type": "application/json"}


@st.composite
def image_requests(draw: st.DrawFn) -> tuple[str, str, bytes, dict[str, str]]:
    """A damaged image (or one as it is) in chat's, Responses' or Messages' image field."""
    name = draw(pick(sorted(sample_images())))
    data = draw(corrupted(sample_images()[name]))
    mime = MIME_BY_SEED[name.split("-")[0]]
    encoded = base64.b64encode(data).decode()
    url = f"data:image/{mime};base64,{encoded}"
    api = draw(st.sampled_from(["chat", "responses", "messages"]))
    if api == "chat":
        content = [
            {"type": "text", "text": "what?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        path, body = (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 1},
        )
    elif api == "responses":
        content = [{"type": "input_image", "image_url": url}]
        path, body = (
            "/v1/responses",
            {"model": "m", "input": [{"role": "user", "content": content}], "max_output_tokens": 1},
        )
    else:
        source = {"type": "base64", "media_type": f"image/{mime}", "data": encoded}
        path, body = (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 1,
                "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
            },
        )
    return "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}


@st.composite
def audio_requests(draw: st.DrawFn) -> tuple[str, str, bytes, dict[str, str]]:
    """A damaged audio file (or one as it is, WAV, MP3 or FLAC) as chat's input_audio item or
    audio data URI: whatever passes the header check reaches llama.cpp's decoder."""
    encoded = base64.b64encode(draw(audio_like())).decode()
    if draw(st.booleans()):
        fmt = draw(st.sampled_from(["wav", "mp3"]))
        item: dict[str, Any] = {
            "type": "input_audio",
            "input_audio": {"data": encoded, "format": fmt},
        }
    else:
        mime = draw(st.sampled_from(["wav", "mpeg", "flac"]))
        item = {"type": "audio_url", "audio_url": {"url": f"data:audio/{mime};base64,{encoded}"}}
    content = [{"type": "text", "text": "what?"}, item]
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    headers = {"Content-Type": "application/json"}
    return "POST", "/v1/chat/completions", json.dumps(body).encode(), headers


@st.composite
def odd_requests(draw: st.DrawFn) -> tuple[str, str, bytes, dict[str, str]]:
    """Other methods and paths, and odd headers on a known path."""
    path = draw(st.sampled_from(OTHER_PATHS + sorted(BODIES)))
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"]))
    headers = draw(
        st.dictionaries(
            st.sampled_from(
                [
                    "Content-Type",
                    "Authorization",
                    "x-api-key",
                    "Origin",
                    "Access-Control-Request-Method",
                    "X-Request-Id",
                    "Accept",
                ]
            ),
            st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30),
            max_size=3,
        )
    )
    body = draw(st.one_of(st.just(b""), st.binary(max_size=32), st.just(b"{}")))
    return method, path, body, headers


requests = st.one_of(
    mutated_requests(),
    mutated_requests(),
    schema_requests(),
    image_requests(),
    audio_requests(),
    odd_requests(),
)


def _strict(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def assert_json(text: bytes | str, where: str) -> Any:
    """`text` is strict JSON (no NaN or Infinity, which clients' parsers refuse)."""
    try:
        return json.loads(text, parse_constant=_strict)
    except ValueError as exc:
        raise AssertionError(f"{where} is not JSON ({exc}): {text[:500]!r}") from None


def assert_sound(answer: Answer, method: str) -> None:
    """No 5xx; every JSON body and streamed event is JSON; an error (but a refused CORS
    preflight, which is plain text as in the reference) is a JSON body with its detail, or
    Anthropic's error."""
    assert answer.status < 500, f"{answer.status}: {answer.body[:1000]!r}"
    if answer.content_type.startswith("text/event-stream"):
        for line in answer.body.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                assert_json(line[6:], "a streamed event")
        return
    if answer.status >= 400 and method == "OPTIONS":
        return
    if answer.status >= 400 or answer.content_type.startswith("application/json"):
        value = assert_json(answer.body, "the body")
        if answer.status >= 400:
            assert "detail" in value or value.get("type") == "error", value


STRAY_BRACKET = {
    "model": "m",
    "messages": [{"role": "user", "content": "x"}],
    "max_tokens": 2,
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "^a]$"}},
    },
}


@fuzz_settings(300)
@given(request=requests)
@example(
    request=("POST", "/v1/chat/completions", b"[" * 100_000, {"Content-Type": "application/json"})
)
@example(  # the converter looped forever on a stray ]: no answer, and the server could not stop
    request=(
        "POST",
        "/v1/chat/completions",
        json.dumps(STRAY_BRACKET).encode(),
        {"Content-Type": "application/json"},
    )
)
def test_no_request_gets_a_server_error_or_kills_the_server(
    fuzz_server: FuzzServer, request: tuple[str, str, bytes, dict[str, str]]
) -> None:
    method, path, body, headers = request
    answer = fuzz_server.request(method, path, body, headers)
    event(f"{method} {path} -> {answer.status}")
    problems = fuzz_server.problems()
    assert not problems, "\n".join(problems)
    assert_sound(answer, method)
