"""The reference's checks (api/reference and each translate.py): its 4xx table, its precedence, and
edgeserve's own 400s.

Every table is one case per line: add a row to add a case.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from edgeserve import errors
from edgeserve.api.openai_chat.translate import parse_chat_request, prepare_chat, would_reject
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.api.reference.errors import error_body
from edgeserve.api.reference.limits import Limits, default_safe_media_path, is_env_enabled
from edgeserve.api.reference.request import (
    EMPTY_BODY,
    body_too_large,
    check_api_key,
    check_can_generate,
    check_can_score,
    decode_json_body,
    method_not_allowed,
    not_found,
)
from edgeserve.api.score.translate import parse_score_request, prepare_score
from edgeserve.engine.types import ChatTurn, SamplingParams, ScoreRequest

URL_PRIVATE = "Invalid URL: 403: Access to private or reserved IP addresses is not allowed."
URL_SCHEME = "Invalid URL: 400: Only HTTP/HTTPS URLs are allowed."
PNG = "data:image/png;base64,iVBORw0KGgo="
TEXT_ONLY_IMAGE = Detail.MEDIA_TEXT_ONLY.format(
    where="messages[0].content[0]", what="an image", plural="images"
)
SURROGATE = json.loads('"\\ud800"')


def user(content: Any = "hi") -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any = "ok", **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def system(content: Any = "be brief") -> dict[str, Any]:
    return {"role": "system", "content": content}


def msg(role: str, content: Any = "x") -> dict[str, Any]:
    return {"role": role, "content": content}


def text(value: Any) -> dict[str, Any]:
    return {"type": "text", "text": value}


def media(url: str, kind: str = "image_url") -> dict[str, Any]:
    return {"type": kind, kind: {"url": url}}


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **fields}


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def tool(name: str = "get_weather") -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": "Get weather", "parameters": parameters},
    }


@pytest.fixture
def limits(tmp_path: Path) -> Limits:
    return Limits(safe_media_path=str(tmp_path / "safe_media"))


async def reject(body: Any, limits: Limits) -> errors.ApiError:
    with pytest.raises(errors.ApiError) as caught:
        await prepare_chat(parse_chat_request(body), limits)
    return caught.value


async def accept(body: Any, limits: Limits) -> Any:
    return await prepare_chat(parse_chat_request(body), limits)


# --- reference error table (section 3.1), chat request level --------------------------------

REFERENCE_CHAT_ERRORS = [
    ("E3 empty messages", chat(), 400, "Invalid length"),
    ("E3 empty even when streaming", chat(stream=True, n=3, tools=[tool()]), 400, "Invalid length"),
    ("E4 only a system message", chat(system()), 400, "Only supports u/a/u/a/u..."),
    ("E4 two messages", chat(user(), assistant()), 400, "Only supports u/a/u/a/u..."),
    ("E4 system then two", chat(system(), user(), assistant()), 400, "Only supports u/a/u/a/u..."),
    (
        "E4 two systems then one",
        chat(system(), system(), user()),
        400,
        "Only supports u/a/u/a/u...",
    ),
    ("E4 before role", chat(assistant(), user()), 400, "Only supports u/a/u/a/u..."),
    ("E5 assistant first", chat(assistant()), 400, "Invalid role"),
    ("E5 function first", chat(msg("function")), 400, "Invalid role"),
    ("E5 user at odd", chat(user(), user(), user()), 400, "Invalid role"),
    ("E5 tool at odd", chat(user(), msg("tool"), user()), 400, "Invalid role"),
    ("E5 assistant at even", chat(user(), assistant(), assistant()), 400, "Invalid role"),
    ("E5 system not first", chat(user(), system(), user()), 400, "Invalid role"),
    ("E5 second system", chat(system(), system()), 400, "Invalid role"),
    ("E5 system last", chat(user(), assistant(), system()), 400, "Invalid role"),
    ("E9 file scheme", chat(user([media("file:///etc/passwd")])), 400, URL_SCHEME),
    ("E9 ftp", chat(user([media("ftp://example.com/x.png")])), 400, URL_SCHEME),
    ("E9 bare name", chat(user([media("cat.png")])), 400, URL_SCHEME),
    ("E9 missing file", chat(user([media("/nonexistent/x.png")])), 400, URL_SCHEME),
    ("E9 scheme-relative", chat(user([media("//host/x")])), 400, URL_SCHEME),
    ("E9 webp data URI", chat(user([media("data:image/webp;base64,AAAA")])), 400, URL_SCHEME),
    ("E9 empty data URI", chat(user([media("data:image/png;base64,")])), 400, URL_SCHEME),
    ("E9 video URI as image", chat(user([media("data:video/mp4;base64,AAAA")])), 400, URL_SCHEME),
    ("E9 uppercase data", chat(user([media("DATA:image/png;base64,AAAA")])), 400, URL_SCHEME),
    ("E9 video ftp", chat(user([media("ftp://h/v.mp4", "video_url")])), 400, URL_SCHEME),
    (
        "E9 audio webm URI",
        chat(user([media("data:audio/webm;base64,AA", "audio_url")])),
        400,
        URL_SCHEME,
    ),
    (
        "E10 no hostname",
        chat(user([media("http:///x.png")])),
        400,
        "Invalid URL: 400: Invalid URL hostname.",
    ),
    ("E11 127.0.0.1", chat(user([media("http://127.0.0.1/x.png")])), 400, URL_PRIVATE),
    ("E11 localhost", chat(user([media("https://localhost/x.png")])), 400, URL_PRIVATE),
    ("E11 [::1]", chat(user([media("http://[::1]/x.png")])), 400, URL_PRIVATE),
    ("E11 0.0.0.0", chat(user([media("http://0.0.0.0/x.png")])), 400, URL_PRIVATE),
    ("E11 10/8", chat(user([media("http://10.0.0.1/x.png")])), 400, URL_PRIVATE),
    ("E11 metadata", chat(user([media("http://169.254.169.254/latest")])), 400, URL_PRIVATE),
    ("E11 link-local v6", chat(user([media("http://[fe80::1]/x")])), 400, URL_PRIVATE),
    ("E11 with port", chat(user([media("http://127.0.0.1:8080/x")])), 400, URL_PRIVATE),
    ("E11 video", chat(user([media("http://127.0.0.1/v.mp4", "video_url")])), 400, URL_PRIVATE),
    ("E11 audio", chat(user([media("http://10.0.0.1/a.wav", "audio_url")])), 400, URL_PRIVATE),
    (
        "E12 unresolvable, lower-cased",
        chat(user([media("http://No-Such-Host.INVALID/x.png")])),
        400,
        "Could not resolve hostname: no-such-host.invalid",
    ),
    (
        "E13 bad port",
        chat(user([media("http://127.0.0.1:abc/x")])),
        400,
        "Invalid URL: Port could not be cast to integer value as 'abc'",
    ),
    (
        "E13 port range",
        chat(user([media("http://127.0.0.1:99999/x")])),
        400,
        "Invalid URL: Port out of range 0-65535",
    ),
    ("E13 bad IPv6", chat(user([media("http://[::1/x")])), 400, "Invalid URL: Invalid IPv6 URL"),
    (
        "E13 empty label",
        chat(user([media("http://a..b/x")])),
        400,
        "Invalid URL: encoding with 'idna' codec failed (UnicodeError: label empty or too long)",
    ),
    (
        "S2 stream with n=2",
        chat(user(), stream=True, n=2),
        400,
        "Cannot stream multiple responses.",
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [case[1:] for case in REFERENCE_CHAT_ERRORS],
    ids=[case[0] for case in REFERENCE_CHAT_ERRORS],
)
async def test_reference_chat_errors(body: Any, status: int, detail: str, limits: Limits) -> None:
    error = await reject(body, limits)
    assert (error.status, error.detail) == (status, detail)
    assert (
        error_body(error.detail, with_message=False)
        == json.dumps({"detail": detail}, separators=(",", ":")).encode()
    )


LOCAL_FILE_CASES = [
    ("E7 local files disabled", False, "inside", 403, "Local file access is disabled."),
    ("E7 wins even outside", False, "outside", 403, "Local file access is disabled."),
    ("E8 outside safe folder", True, "outside", 400, "Invalid or inaccessible file path."),
    ("E8 sibling folder", True, "sibling", 400, "Invalid or inaccessible file path."),
    ("E8 escape by ..", True, "dotdot", 400, "Invalid or inaccessible file path."),
    ("inside passes to text-only", True, "inside", 400, "text-only"),
]


@pytest.mark.parametrize(
    ("allow", "where", "status", "detail"),
    [case[1:] for case in LOCAL_FILE_CASES],
    ids=[case[0] for case in LOCAL_FILE_CASES],
)
async def test_local_files(
    tmp_path: Path, allow: bool, where: str, status: int, detail: str
) -> None:
    safe = tmp_path / "safe_media"
    paths = {
        "inside": safe / "cat.png",
        "outside": tmp_path / "cat.png",
        "sibling": tmp_path / "safe_media_x" / "cat.png",
        "dotdot": tmp_path / "cat.png",
    }
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x89PNG")
    url = str(safe / ".." / "cat.png") if where == "dotdot" else str(paths[where])
    limits = Limits(allow_local_files=allow, safe_media_path=str(safe))
    error = await reject(chat(user([media(url)])), limits)
    assert error.status == status
    if detail == "text-only":
        assert error.detail == TEXT_ONLY_IMAGE
    else:
        assert error.detail == detail


async def test_safe_folder_is_never_created(tmp_path: Path) -> None:
    limits = Limits(safe_media_path=str(tmp_path / "not_there"))
    (tmp_path / "cat.png").write_bytes(b"x")
    error = await reject(chat(user([media(str(tmp_path / "cat.png"))])), limits)
    assert error.detail == "Invalid or inaccessible file path."
    assert not (tmp_path / "not_there").exists()


# --- precedence (section 2) ------------------------------------------------------------------

PRECEDENCE = [
    (
        "role error in message 0 beats media error in message 0",
        chat(assistant([media("file:///x")])),
        "Invalid role",
    ),
    (
        "media error in message 0 beats role error in message 1",
        chat(user([media("file:///x")]), user(), user()),
        URL_SCHEME,
    ),
    (
        "media error in message 0 beats media error in message 2",
        chat(user([media("http:///x")]), assistant(), user([media("file:///x")])),
        "Invalid URL: 400: Invalid URL hostname.",
    ),
    (
        "first failing item of a message wins",
        chat(user([text("a"), media("ftp://x"), media("http:///x")])),
        URL_SCHEME,
    ),
    (
        "tools stream (divergence 6); n=2 still cannot",
        chat(user(), stream=True, n=2, tools=[tool()]),
        "Cannot stream multiple responses.",
    ),
    (
        "process errors beat stream checks",
        chat(user([media("file:///x")]), stream=True, n=2, tools=[tool()]),
        URL_SCHEME,
    ),
    (
        "role error beats stream checks",
        chat(assistant(), stream=True, n=2),
        "Invalid role",
    ),
    (
        "system message media is never checked",
        chat(system([media("file:///x")]), assistant()),
        "Invalid role",
    ),
    (
        "assistant tool_calls skip content checks",
        chat(user(), assistant([media("file:///x")], tool_calls=[call("f", "{}")]), user()),
        None,
    ),
    (
        "reference media error beats a null content earlier",
        chat(user(None), assistant(), user([media("file:///x")])),
        URL_SCHEME,
    ),
    (
        "reference media error beats a text-only image earlier",
        chat(user([media(PNG)]), assistant(), user([media("ftp://x")])),
        URL_SCHEME,
    ),
    (
        "stream n check beats a null content",
        chat(user(None), stream=True, n=2),
        "Cannot stream multiple responses.",
    ),
    (
        "stream with tools and n=0 reaches the n check",
        chat(user(), stream=True, n=0, tools=[tool()]),
        '"n" must be at least 1, got 0.',
    ),
    (
        "tool without function beats stream checks",
        chat(user(), stream=True, n=2, tools=[{"type": "function"}]),
        Detail.TOOL_WITHOUT_FUNCTION.format(index=0),
    ),
    (
        "role error beats tool without function",
        chat(assistant(), tools=[{"type": "function"}]),
        "Invalid role",
    ),
    (
        "media error beats tool without function",
        chat(user([media("file:///x")]), tools=[{"type": "function"}]),
        URL_SCHEME,
    ),
    (
        "null content beats sampling checks",
        chat(user(None), n=0),
        Detail.CONTENT_NULL.format(index=0),
    ),
]


@pytest.mark.parametrize(
    ("body", "detail"),
    [case[1:] for case in PRECEDENCE],
    ids=[case[0] for case in PRECEDENCE],
)
async def test_precedence(body: Any, detail: str | None, limits: Limits) -> None:
    if detail is None:
        await accept(body, limits)
    else:
        assert (await reject(body, limits)).detail == detail


@pytest.mark.parametrize("tool_choice", [None, "auto", "required"])
async def test_tools_may_stream(limits: Limits, tool_choice: str | None) -> None:
    request = await accept(
        chat(user(), stream=True, tools=[tool()], tool_choice=tool_choice), limits
    )
    assert request.prompt.tools is not None
    assert (request.params.grammar is not None) == (tool_choice == "required")


async def test_stream_checks_allow_empty_tools_and_n_1(limits: Limits) -> None:
    request = await accept(chat(user(), stream=True, tools=[], n=1), limits)
    assert request.prompt.tools is None


# --- edgeserve's own 400s (divergences 2 and limits) -----------------------------------------

DIVERGENCES = [
    (
        "text item without text",
        chat(user([text(None)])),
        'messages[0].content[0] has type "text" but no "text" string; '
        "add the text or remove the item.",
    ),
    (
        "image item without image_url",
        chat(user([text("a"), {"type": "image_url"}])),
        'messages[0].content[1] has type "image_url" but no "image_url" object; '
        'add {"image_url": {"url": "..."}} or remove the item.',
    ),
    (
        "video item with only an image_url",
        chat(user([{"type": "video_url", "image_url": {"url": PNG}}])),
        Detail.MEDIA_WITHOUT_URL.format(where="messages[0].content[0]", kind="video_url"),
    ),
    (
        "audio item without audio_url, index after system",
        chat(system(), user([{"type": "audio_url"}])),
        Detail.MEDIA_WITHOUT_URL.format(where="messages[1].content[0]", kind="audio_url"),
    ),
    (
        "data URI with bad padding",
        chat(user([media("data:image/png;base64,abc")])),
        "messages[0].content[0].image_url.url is a data URI whose payload is not valid base64 "
        "data; encode the file with standard base64.",
    ),
    (
        "data URI that decodes to nothing",
        chat(user([media("data:audio/wav;base64,!!!!", "audio_url")])),
        Detail.BAD_DATA_URI.format(where="messages[0].content[0]", kind="audio_url"),
    ),
    (
        "image for a text-only model",
        chat(user([text("what is this?"), media(PNG)])),
        "messages[0].content[1] is an image, but this server's model takes text only; start it "
        "with --mmproj PROJECTOR.gguf (the model's multimodal projector) to send images, or "
        "send text content only.",
    ),
    (
        "public image URL for a text-only model",
        chat(user([media("http://8.8.8.8/cat.png")])),
        TEXT_ONLY_IMAGE,
    ),
    (
        "video for a text-only model",
        chat(user([media("data:video/mp4;base64,AAAA", "video_url")])),
        "messages[0].content[0] is a video, which this server does not take (llama.cpp's "
        "multimodal library reads video only through an external ffmpeg program); send frames "
        "of it as images.",
    ),
    (
        "audio for a text-only model",
        chat(user([media("data:audio/mp3;base64,AAAA", "audio_url")])),
        "messages[0].content[0] is audio, but this server's model takes text only; start it "
        "with --mmproj PROJECTOR.gguf (the model's multimodal projector) to send audio, or "
        "send text content only.",
    ),
    (
        "tool without function",
        chat(user(), tools=[tool(), {"type": "code_interpreter"}]),
        'tools[1] has no "function"; give each tool a "function" object with '
        '"name" and "parameters" (and optionally "description").',
    ),
    (
        "null content",
        chat(user(None)),
        "messages[0].content is null; give the message a content string "
        "(only an assistant message with tool_calls may omit it).",
    ),
    (
        "null content counted with the system message",
        chat(system(), user(), assistant(None), user()),
        Detail.CONTENT_NULL.format(index=2),
    ),
    (
        "null content with empty tool_calls",
        chat(user(), assistant(None, tool_calls=[]), user()),
        Detail.CONTENT_NULL.format(index=1),
    ),
    ("n = 0", chat(user(), n=0), '"n" must be at least 1, got 0.'),
    ("n < 0", chat(user(), n=-3), '"n" must be at least 1, got -3.'),
    ("n over max_n", chat(user(), n=17), '"n" is 17 but this server allows at most 16; lower it.'),
    ("max_tokens = 0", chat(user(), max_tokens=0), '"max_tokens" must be at least 1, got 0.'),
    ("max_tokens < 0", chat(user(), max_tokens=-5), '"max_tokens" must be at least 1, got -5.'),
    (
        "max_completion_tokens = 0",
        chat(user(), max_completion_tokens=0, max_tokens=5),
        '"max_completion_tokens" must be at least 1, got 0.',
    ),
    (
        "temperature < 0",
        chat(user(), temperature=-0.5),
        '"temperature" must be at least 0.0, got -0.5.',
    ),
    (
        "temperature NaN",
        chat(user(), temperature=math.nan),
        '"temperature" must be a finite number, got nan.',
    ),
    (
        "temperature inf",
        chat(user(), temperature=math.inf),
        '"temperature" must be a finite number, got inf.',
    ),
    ("top_p > 1", chat(user(), top_p=1.5), '"top_p" must be between 0.0 and 1.0, got 1.5.'),
    ("top_p < 0", chat(user(), top_p=-0.1), '"top_p" must be between 0.0 and 1.0, got -0.1.'),
    (
        "presence_penalty > 2",
        chat(user(), presence_penalty=3.0),
        '"presence_penalty" must be between -2.0 and 2.0, got 3.0.',
    ),
    ("top_k < 0", chat(user(), top_k=-1), '"top_k" must be at least 0, got -1.'),
    ("min_p > 1", chat(user(), min_p=2), '"min_p" must be between 0.0 and 1.0, got 2.0.'),
    (
        "frequency_penalty < -2",
        chat(user(), frequency_penalty=-2.5),
        '"frequency_penalty" must be between -2.0 and 2.0, got -2.5.',
    ),
    (
        "repetition_penalty = 0",
        chat(user(), repetition_penalty=0),
        '"repetition_penalty" must be greater than 0.0, got 0.0.',
    ),
    (
        "repetition_penalty < 0",
        chat(user(), repetition_penalty=-1.1),
        '"repetition_penalty" must be greater than 0.0, got -1.1.',
    ),
    (
        "top_logprobs > 20",
        chat(user(), top_logprobs=21),
        '"top_logprobs" must be between 0 and 20, got 21.',
    ),
    (
        "logit_bias word key",
        chat(user(), logit_bias={"hello": 1}),
        '"logit_bias" keys must be token ids written as decimal integers of at most 9 digits, '
        'got "hello".',
    ),
    (
        "logit_bias negative key",
        chat(user(), logit_bias={"-1": 1}),
        Detail.LOGIT_BIAS_KEY.format(key='"-1"'),
    ),
    (
        "logit_bias padded key",
        chat(user(), logit_bias={" 12": 1}),
        Detail.LOGIT_BIAS_KEY.format(key='" 12"'),
    ),
    (
        "logit_bias 10-digit key",
        chat(user(), logit_bias={"9" * 10: 1}),
        Detail.LOGIT_BIAS_KEY.format(key='"9999999999"'),
    ),
    (
        "logit_bias 5000-digit key",
        chat(user(), logit_bias={"9" * 5000: 1}),
        Detail.LOGIT_BIAS_KEY.format(key=json.dumps("9" * 5000)),
    ),
    (
        "seed over int64",
        chat(user(), seed=2**63),
        f'"seed" must be between {-(2**63)} and {2**63 - 1}, got {2**63}.',
    ),
    (
        "4000-digit n",
        chat(user(), n=10**4000),
        f'"n" is {10**4000} but this server allows at most 16; lower it.',
    ),
    (
        "logit_bias NaN value",
        chat(user(), logit_bias={"12": math.nan}),
        '"logit_bias[12]" must be a finite number, got nan.',
    ),
    (
        "json_schema without schema",
        chat(user(), response_format={"type": "json_schema"}),
        '"response_format" has type "json_schema" but no "json_schema"; add the schema object.',
    ),
    (
        "lone surrogate in content",
        chat(user(f"a{SURROGATE}")),
        "messages[0] contains an unpaired UTF-16 surrogate; send valid Unicode text.",
    ),
    (
        "lone surrogate in model",
        {**chat(user()), "model": SURROGATE},
        Detail.BAD_UNICODE.format(where="model"),
    ),
    (
        "lone surrogate in system",
        chat(system(SURROGATE), user()),
        Detail.BAD_UNICODE.format(where="the system message"),
    ),
    (
        "lone surrogate in a later turn",
        chat(system(), user(), assistant(SURROGATE), user()),
        Detail.BAD_UNICODE.format(where="messages[2]"),
    ),
    (
        "lone surrogate in stop",
        chat(user(), stop=["ok", SURROGATE]),
        Detail.BAD_UNICODE.format(where="stop"),
    ),
    (
        "lone surrogate in tools",
        chat(user(), tools=[tool(SURROGATE)]),
        Detail.BAD_UNICODE.format(where="tools"),
    ),
]


@pytest.mark.parametrize(
    ("body", "detail"),
    [case[1:] for case in DIVERGENCES],
    ids=[case[0] for case in DIVERGENCES],
)
async def test_divergence_400s(body: Any, detail: str, limits: Limits) -> None:
    error = await reject(body, limits)
    assert (error.status, error.detail) == (400, detail)


LIMIT_CASES = [
    (
        "max_tokens over cap",
        {"max_tokens": 101},
        '"max_tokens" is 101 but this server allows at most 100; lower it.',
    ),
    (
        "max_completion_tokens over cap",
        {"max_completion_tokens": 500, "max_tokens": 5},
        '"max_completion_tokens" is 500 but this server allows at most 100; lower it.',
    ),
    ("n over a lower max_n", {"n": 3}, '"n" is 3 but this server allows at most 2; lower it.'),
    ("at the caps", {"n": 2, "max_tokens": 100}, None),
]


@pytest.mark.parametrize(
    ("fields", "detail"),
    [case[1:] for case in LIMIT_CASES],
    ids=[case[0] for case in LIMIT_CASES],
)
async def test_configured_limits(
    fields: dict[str, Any], detail: str | None, tmp_path: Path
) -> None:
    limits = Limits(max_n=2, max_tokens=100, safe_media_path=str(tmp_path))
    if detail is None:
        await accept(chat(user(), **fields), limits)
    else:
        assert (await reject(chat(user(), **fields), limits)).detail == detail


# --- transformations (section 5) -------------------------------------------------------------

SYSTEM_PROMPTS = [
    ("no system message", chat(user()), None),
    ("string", chat(system("Be brief."), user()), "Be brief."),
    ("null", chat(system(None), user()), None),
    ("list: first text only", chat(system([text("A"), text("B")]), user()), "A"),
    ("list: image first", chat(system([media(PNG), text("B")]), user()), None),
    ("list: empty", chat(system([]), user()), ""),
    ("list: text item without text", chat(system([text(None)]), user()), None),
]


@pytest.mark.parametrize(
    ("body", "expected"),
    [case[1:] for case in SYSTEM_PROMPTS],
    ids=[case[0] for case in SYSTEM_PROMPTS],
)
async def test_system_prompt(body: Any, expected: str | None, limits: Limits) -> None:
    request = await accept(body, limits)
    assert request.prompt.system == expected
    assert request.prompt.messages == (ChatTurn("user", "hi"),)


TURNS = [
    ("plain user", [user("hello")], [("user", "hello")]),
    ("tool first", [msg("tool", "42")], [("tool", "42")]),
    (
        "all four roles",
        [user("q"), msg("function", "call"), msg("tool", "result"), assistant("a"), user("thanks")],
        [
            ("user", "q"),
            ("function", "call"),
            ("tool", "result"),
            ("assistant", "a"),
            ("user", "thanks"),
        ],
    ),
    (
        "assistant tool_calls become a function turn",
        [
            user("weather?"),
            assistant("dropped", tool_calls=[call("get_weather", '{"city": "Paris"}')]),
            msg("tool", "sunny"),
        ],
        [
            ("user", "weather?"),
            ("function", '[{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]'),
            ("tool", "sunny"),
        ],
    ),
    (
        "parallel calls, raw UTF-8, null content",
        [
            user("?"),
            assistant(None, tool_calls=[call("météo", '{"ville":"Zürich"}'), call("f", "")]),
            user("!"),
        ],
        [
            ("user", "?"),
            (
                "function",
                '[{"name": "météo", "arguments": "{\\"ville\\":\\"Zürich\\"}"}, '
                '{"name": "f", "arguments": ""}]',
            ),
            ("user", "!"),
        ],
    ),
    (
        "empty tool_calls keep the content",
        [user("q"), assistant("a", tool_calls=[]), user("r")],
        [("user", "q"), ("assistant", "a"), ("user", "r")],
    ),
    (
        "tool_calls on a user message are ignored",
        [{"role": "user", "content": "q", "tool_calls": [call("f", "{}")]}],
        [("user", "q")],
    ),
    ("list content is concatenated", [user([text("a"), text("b"), text("")])], [("user", "ab")]),
    ("empty list content", [user([])], [("user", "")]),
]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [case[1:] for case in TURNS],
    ids=[case[0] for case in TURNS],
)
async def test_turns(
    messages: list[dict[str, Any]], expected: list[tuple[str, str]], limits: Limits
) -> None:
    request = await accept(chat(*messages), limits)
    assert request.prompt.messages == tuple(ChatTurn(role, content) for role, content in expected)


async def test_tools_serialization(limits: Limits) -> None:
    request = await accept(chat(user(), tools=[tool(), tool("café")]), limits)
    assert request.prompt.tools == (
        '[{"name": "get_weather", "description": "Get weather", "parameters": '
        '{"type": "object", "properties": {"city": {"type": "string"}}}}, '
        '{"name": "café", "description": "Get weather", "parameters": '
        '{"type": "object", "properties": {"city": {"type": "string"}}}}]'
    )


async def test_a_tool_without_description_is_shown_without_one(limits: Limits) -> None:
    plain = {"function": {"name": "now", "parameters": {"type": "object"}}}
    request = await accept(chat(user(), tools=[plain]), limits)
    assert request.prompt.tools == '[{"name": "now", "parameters": {"type": "object"}}]'


@pytest.mark.parametrize("tools", [None, []], ids=["null", "empty"])
async def test_no_tools(tools: Any, limits: Limits) -> None:
    assert (await accept(chat(user(), tools=tools), limits)).prompt.tools is None


SAMPLING = [
    ("defaults", {}, {}),
    ("temperature 0 is greedy", {"temperature": 0}, {"temperature": 0.0}),
    (
        "do_sample false",
        {"do_sample": False, "temperature": 0.7},
        {"do_sample": False, "temperature": 0.7},
    ),
    ("n>1 forces sampling at 1.0", {"n": 3, "temperature": 0}, {"temperature": 1.0}),
    (
        "n>1 overrides do_sample",
        {"n": 2, "do_sample": False, "temperature": 0.4},
        {"temperature": 0.4},
    ),
    (
        "top_p/top_k/min_p",
        {"top_p": 0.9, "top_k": 40, "min_p": 0.05},
        {"top_p": 0.9, "top_k": 40, "min_p": 0.05},
    ),
    ("seed", {"seed": 1234}, {"seed": 1234}),
    ("negative seed", {"seed": -(2**63)}, {"seed": -(2**63)}),
    ("huge top_k is clamped", {"top_k": 10**400}, {"top_k": 2**31 - 1}),
    ("presence_penalty keeps its meaning", {"presence_penalty": 0.5}, {"presence_penalty": 0.5}),
    ("repetition_penalty", {"repetition_penalty": 1.1}, {"repeat_penalty": 1.1}),
    ("frequency_penalty", {"frequency_penalty": -1.5}, {"frequency_penalty": -1.5}),
    ("max_tokens", {"max_tokens": 5}, {"max_tokens": 5}),
    (
        "max_completion_tokens wins",
        {"max_tokens": 5, "max_completion_tokens": 7},
        {"max_tokens": 7},
    ),
    ("stop string", {"stop": "\n\n"}, {"stop": ("\n\n",)}),
    ("stop list drops empties", {"stop": ["a", "", "b"]}, {"stop": ("a", "b")}),
    ("stop empty string", {"stop": ""}, {}),
    (
        "logit_bias",
        {"logit_bias": {"42": 150, "7": -5.5, "0": -1000}},
        {"logit_bias": {42: 100.0, 7: -5.5, 0: -100.0}},
    ),
    ("lax strings", {"temperature": "0.5", "n": "2", "seed": "7"}, {"temperature": 0.5, "seed": 7}),
]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [case[1:] for case in SAMPLING],
    ids=[case[0] for case in SAMPLING],
)
async def test_sampling_params(
    fields: dict[str, Any], expected: dict[str, Any], limits: Limits
) -> None:
    request = await accept(chat(user(), **fields), limits)
    assert request.params == SamplingParams(**expected)
    assert request.n == int(fields.get("n", 1))


async def test_request_is_not_mutated(limits: Limits) -> None:
    req = parse_chat_request(chat(system(), user()))
    await prepare_chat(req, limits)
    assert len(req.messages) == 2


# --- body decoding (section 2 step 2, E14) ---------------------------------------------------

DECODE = [
    ("empty JSON body", b"", "application/json", EMPTY_BODY),
    ("empty text body", b"", "text/plain", EMPTY_BODY),
    ("empty, no content type", b"", None, EMPTY_BODY),
    ("JSON object", b'{"a": 1}', "application/json", {"a": 1}),
    ("JSON null", b"null", "application/json", None),
    ("charset parameter", b"[1]", "application/json; charset=utf-8", [1]),
    ("upper case type", b"[1]", "Application/JSON", [1]),
    ("+json subtype", b"[2]", "application/vnd.api+json", [2]),
    ("NaN literal", b"[NaN]", "application/json", "nan-list"),
    ("UTF-8 BOM", b"\xef\xbb\xbf[3]", "application/json", [3]),
    ("text/plain keeps raw text", b'{"a": 1}', "text/plain", '{"a": 1}'),
    ("no content type keeps raw text", b'{"a": 1}', None, '{"a": 1}'),
    ("application/x-json is not JSON", b"[1]", "application/x-www-form-urlencoded", "[1]"),
    ("not a media type", b"[1]", "json", "[1]"),
    ("raw invalid UTF-8 replaced", b"\xffab", "text/plain", "\ufffdab"),
]


@pytest.mark.parametrize(
    ("raw", "content_type", "expected"),
    [case[1:] for case in DECODE],
    ids=[case[0] for case in DECODE],
)
def test_decode_json_body(raw: bytes, content_type: str | None, expected: Any) -> None:
    decoded = decode_json_body(raw, content_type)
    if expected == "nan-list":
        assert len(decoded) == 1 and math.isnan(decoded[0])
    else:
        assert decoded == expected


DECODE_ERRORS = [
    (
        "truncated",
        b'{"model": "m", "messages": [',
        422,
        '[{"type":"json_invalid","loc":["body",28],"msg":"JSON decode error","input":{},'
        '"ctx":{"error":"Expecting value"}}]',
    ),
    (
        "unquoted key",
        b"{bad",
        422,
        '[{"type":"json_invalid","loc":["body",1],"msg":"JSON decode error","input":{},'
        '"ctx":{"error":"Expecting property name enclosed in double quotes"}}]',
    ),
    (
        "offset counts characters",
        '{"é": x}'.encode(),
        422,
        '[{"type":"json_invalid","loc":["body",6],"msg":"JSON decode error","input":{},'
        '"ctx":{"error":"Expecting value"}}]',
    ),
    ("E14 invalid UTF-8", b'{"model": "\xff"}', 400, '"There was an error parsing the body"'),
    ("E14 huge integer", b"[" + b"9" * 5000 + b"]", 400, '"There was an error parsing the body"'),
    ("E14 nesting too deep", b"[" * 100000, 400, '"There was an error parsing the body"'),
]


@pytest.mark.parametrize(
    ("raw", "status", "detail_json"),
    [case[1:] for case in DECODE_ERRORS],
    ids=[case[0] for case in DECODE_ERRORS],
)
def test_decode_json_body_errors(raw: bytes, status: int, detail_json: str) -> None:
    with pytest.raises(errors.ApiError) as caught:
        decode_json_body(raw, "application/json")
    assert caught.value.status == status
    assert (
        error_body(caught.value.detail, with_message=False)
        == f'{{"detail":{detail_json}}}'.encode()
    )


# --- auth (section 1.1, E1) ------------------------------------------------------------------

AUTH = [
    ("no keys, no header", None, [], True),
    ("no keys, garbage header", "Basic abc", [], True),
    ("empty key disables auth", None, [""], True),
    ("missing header", None, ["k"], False),
    ("empty header", "", ["k"], False),
    ("exact", "Bearer k", ["k"], True),
    ("lower-case scheme", "bearer k", ["k"], True),
    ("upper-case scheme", "BEARER k", ["k"], True),
    ("credentials stripped", "Bearer   k  ", ["k"], True),
    ("wrong key", "Bearer k2", ["k"], False),
    ("prefix of the key", "Bearer k", ["kk"], False),
    ("other scheme", "Basic k", ["k"], False),
    ("scheme only", "Bearer", ["k"], False),
    ("scheme and space", "Bearer ", ["k"], False),
    ("no scheme", "k", ["k"], False),
    ("leading space", " Bearer k", ["k"], False),
    ("tab is not the separator", "Bearer\tk", ["k"], False),
    ("split at the first space", "Bearer a b", ["a b"], True),
    ("second of two keys", "Bearer two", ["one", "two"], True),
    ("non-ASCII key", "Bearer clé", ["clé"], True),
    ("non-ASCII mismatch", "Bearer cle", ["clé"], False),
    ("lone surrogate credentials", f"Bearer {SURROGATE}", ["k"], False),
    ("a bare str is one key", "Bearer s", "secret", False),
    ("a bare str key matches", "Bearer secret", "secret", True),
]


@pytest.mark.parametrize(
    ("header", "keys", "ok"),
    [case[1:] for case in AUTH],
    ids=[case[0] for case in AUTH],
)
def test_check_api_key(header: str | None, keys: list[str], ok: bool) -> None:
    if ok:
        check_api_key(header, keys)
    else:
        with pytest.raises(errors.ApiError) as caught:
            check_api_key(header, keys)
        assert (caught.value.status, caught.value.detail, caught.value.headers) == (
            401,
            "Invalid API key.",
            {},
        )


# --- capability gate, routing, engine errors -------------------------------------------------


@pytest.mark.parametrize("check", [check_can_generate, check_can_score])
def test_not_allowed(check: Any) -> None:
    check(True)
    with pytest.raises(errors.ApiError) as caught:
        check(False)
    assert (caught.value.status, caught.value.detail) == (405, "Not allowed")


ROUTING = [
    ("E16", not_found(), 404, "Not Found", {}),
    ("E17 POST", method_not_allowed(["POST"]), 405, "Method Not Allowed", {"Allow": "POST"}),
    ("E17 GET", method_not_allowed(("GET",)), 405, "Method Not Allowed", {"Allow": "GET"}),
    (
        "E17 two",
        method_not_allowed(["GET", "HEAD"]),
        405,
        "Method Not Allowed",
        {"Allow": "GET, HEAD"},
    ),
    (
        "413",
        body_too_large(1048576),
        413,
        "The request body is larger than this server's limit of 1048576 bytes; "
        "send a smaller request.",
        {},
    ),
    (
        "busy",
        engine_error(errors.EngineOverloaded()),
        503,
        "Server is busy: the request queue is full; retry later.",
        {"Retry-After": "1"},
    ),
    (
        "stopping",
        engine_error(errors.EngineStopped()),
        503,
        Detail.SHUTTING_DOWN,
        {"Retry-After": "5"},
    ),
    (
        "loading",
        engine_error(errors.EngineLoading()),
        503,
        "The model is still loading; retry in a few seconds.",
        {"Retry-After": "2"},
    ),
    (
        "prompt too long",
        engine_error(errors.PromptTooLong(5000, 4096)),
        400,
        "The prompt is 5000 tokens but the context window is 4096 tokens; "
        "shorten the messages (it must leave room for at least one new token).",
        {},
    ),
    (
        "score text too long",
        engine_error(errors.PromptTooLong(5000, 4096, index=3)),
        400,
        "Text 3 (messages[3]) is 5000 tokens but the context window is 4096 tokens; "
        "shorten it or set max_length.",
        {},
    ),
    (
        "request too large",
        engine_error(errors.RequestTooLarge("prompt tokens of all texts", 90000, 65536)),
        400,
        "prompt tokens of all texts: 90000 exceeds this server's limit of 65536; lower it.",
        {},
    ),
    (
        "unknown engine error",
        engine_error(errors.EngineError("boom")),
        500,
        "Internal Server Error",
        {},
    ),
]


@pytest.mark.parametrize(
    ("error", "status", "detail", "headers"),
    [case[1:] for case in ROUTING],
    ids=[case[0] for case in ROUTING],
)
def test_error_factories(
    error: errors.ApiError, status: int, detail: str, headers: dict[str, str]
) -> None:
    assert (error.status, error.detail, error.headers) == (status, detail, headers)


# --- score (E6 and limits) -------------------------------------------------------------------

SCORE = [
    ("E6 no texts", {"messages": []}, "Invalid request"),
    (
        "max_length 0",
        {"messages": ["a"], "max_length": 0},
        '"max_length" must be at least 1, got 0.',
    ),
    (
        "max_length < 0",
        {"messages": ["a"], "max_length": -4},
        '"max_length" must be at least 1, got -4.',
    ),
    (
        "too many texts",
        {"messages": ["a", "b", "c"]},
        '"messages" has 3 texts but this server scores at most 2 per request; split the request.',
    ),
    (
        "lone surrogate",
        {"messages": ["a", SURROGATE]},
        Detail.BAD_UNICODE.format(where="messages[1]"),
    ),
    ("E6 beats max_length", {"messages": [], "max_length": 0}, "Invalid request"),
]


@pytest.mark.parametrize(
    ("fields", "detail"),
    [case[1:] for case in SCORE],
    ids=[case[0] for case in SCORE],
)
def test_score_errors(fields: dict[str, Any], detail: str) -> None:
    req = parse_score_request({"model": "rm", **fields})
    with pytest.raises(errors.ApiError) as caught:
        prepare_score(req, Limits(max_score_texts=2, safe_media_path="/nonexistent"))
    assert (caught.value.status, caught.value.detail) == (400, detail)


SCORE_JOBS = [
    ("defaults", {"messages": ["a", "b"]}, ScoreRequest(("a", "b"), None)),
    (
        "extensions",
        {"messages": ["a"], "max_length": 8, "reduction": "sum", "return_token_logprobs": True},
        ScoreRequest(("a",), 8, "sum", True),
    ),
    ("empty text is allowed", {"messages": [""]}, ScoreRequest(("",), None)),
]


@pytest.mark.parametrize(
    ("fields", "job"),
    [case[1:] for case in SCORE_JOBS],
    ids=[case[0] for case in SCORE_JOBS],
)
def test_score_jobs(fields: dict[str, Any], job: ScoreRequest) -> None:
    req = parse_score_request({"model": "rm", **fields})
    assert prepare_score(req, Limits(safe_media_path="/nonexistent")) == job


# --- limits from the environment (section 9) -------------------------------------------------

ENV_FLAGS = [
    ("unset is enabled", {}, True),
    ("1", {"ALLOW_LOCAL_FILES": "1"}, True),
    ("true", {"ALLOW_LOCAL_FILES": "true"}, True),
    ("TRUE", {"ALLOW_LOCAL_FILES": "TRUE"}, True),
    ("y", {"ALLOW_LOCAL_FILES": "y"}, True),
    ("Y", {"ALLOW_LOCAL_FILES": "Y"}, True),
    ("yes is disabled", {"ALLOW_LOCAL_FILES": "yes"}, False),
    ("on is disabled", {"ALLOW_LOCAL_FILES": "on"}, False),
    ("0", {"ALLOW_LOCAL_FILES": "0"}, False),
    ("false", {"ALLOW_LOCAL_FILES": "false"}, False),
    ("empty", {"ALLOW_LOCAL_FILES": ""}, False),
]


@pytest.mark.parametrize(
    ("environ", "enabled"),
    [case[1:] for case in ENV_FLAGS],
    ids=[case[0] for case in ENV_FLAGS],
)
def test_allow_local_files_env(environ: dict[str, str], enabled: bool) -> None:
    assert Limits.from_env(environ).allow_local_files is enabled
    assert is_env_enabled(environ, "ALLOW_LOCAL_FILES", "1") is enabled


SAFE_PATHS = [
    ("XDG cache", {"XDG_CACHE_HOME": "/var/cache/x"}, "/var/cache/x/edgeserve/safe_media"),
    ("explicit", {"SAFE_MEDIA_PATH": "/srv/media", "XDG_CACHE_HOME": "/c"}, "/srv/media"),
    (
        "empty means default",
        {"SAFE_MEDIA_PATH": "", "XDG_CACHE_HOME": "/c"},
        "/c/edgeserve/safe_media",
    ),
    ("relative is made absolute", {"SAFE_MEDIA_PATH": "media"}, os.path.abspath("media")),
]


@pytest.mark.parametrize(
    ("environ", "path"),
    [case[1:] for case in SAFE_PATHS],
    ids=[case[0] for case in SAFE_PATHS],
)
def test_safe_media_path_env(environ: dict[str, str], path: str) -> None:
    assert Limits.from_env(environ).safe_media_path == path


def test_default_safe_media_path_without_xdg() -> None:
    expected = os.path.join(os.path.expanduser("~"), ".cache", "edgeserve", "safe_media")
    assert default_safe_media_path({}) == expected


def test_limits_defaults() -> None:
    limits = Limits.from_env({})
    assert (limits.max_n, limits.max_tokens, limits.max_score_texts) == (16, None, 256)
    assert limits.media_kinds == frozenset()
    assert (limits.max_media_items, limits.max_media_bytes) == (8, 20 * 1024 * 1024)
    assert not limits.allow_private_media_urls and limits.fetcher is None


# --- would_reject ----------------------------------------------------------------------------

WOULD_REJECT = [
    ("valid", chat(user()), {}, None),
    ("schema error", {"model": "m"}, {}, 422),
    ("empty body", EMPTY_BODY, {}, 422),
    ("process error", chat(), {}, 400),
    ("stream check", chat(user(), stream=True, n=2), {}, 400),
    ("stream check skipped", chat(user(), stream=True, n=2), {"stream_checks": False}, None),
    ("limits applied", chat(user(), n=3), {"limits": Limits(max_n=2, safe_media_path="/x")}, 400),
]


@pytest.mark.parametrize(
    ("body", "options", "status"),
    [case[1:] for case in WOULD_REJECT],
    ids=[case[0] for case in WOULD_REJECT],
)
async def test_would_reject(body: Any, options: dict[str, Any], status: int | None) -> None:
    error = await would_reject(body, **options)
    assert (error.status if error else None) == status
