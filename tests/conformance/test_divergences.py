"""PRODUCT.md 3.1 divergences over HTTP.

1. Stream-mode validation errors are clean JSON errors sent before any SSE byte (the E-table
   rows run in both modes in test_errors.py; here: S2 and edgeserve's own checks).
2. No 500 for anything a client sends: a fuzz table of inputs that crash the reference.

And README divergence 21: media URL and path checks that give nothing away and cost nothing
for media the request cannot take.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

from tests.conformance.wire import (
    CHAT,
    EOS_NOW,
    JSON,
    PNG,
    SCORE,
    TOOL,
    USER,
    Reply,
    assert_error,
    chat,
    detail,
    media,
    post,
    send,
)

NULL_CONTENT = (
    "messages[{i}].content is null; give the message a content string "
    "(only an assistant message with tool_calls may omit it)."
)
NO_TEXT = (
    'messages[0].content[{j}] has type "text" but no "text" string; '
    "add the text or remove the item."
)
NO_URL = (
    'messages[0].content[1] has type "{k}" but no "{k}" object; '
    'add {{"{k}": {{"url": "..."}}}} or remove the item.'
)
NO_FUNCTION = (
    'tools[{i}] has no "function"; give each tool a "function" object with '
    '"name" and "parameters" (and optionally "description").'
)
BAD_BASE64 = (
    "messages[0].content[1].{k}.url is a data URI whose payload is not valid base64 data; "
    "encode the file with standard base64."
)
TEXT_ONLY = (
    "messages[0].content[1] is {what}, but this server's model takes text only; start it with "
    "--mmproj PROJECTOR.gguf (the model's multimodal projector) to send {plural}, or send text "
    "content only."
)
VIDEO = (
    "messages[0].content[1] is a video, which this server does not take (llama.cpp's "
    "multimodal library reads video only through an external ffmpeg program); send frames of "
    "it as images."
)
SURROGATE = "{w} contains an unpaired UTF-16 surrogate; send valid Unicode text."
POSITIVE = '"{n}" must be at least 1, got {v}.'
OVER = '"{n}" is {v} but this server allows at most {limit}; lower it.'
FINITE = '"{n}" must be a finite number, got {v}.'
BETWEEN = '"{n}" must be between {lo} and {hi}, got {v}.'
# The prompt's token count depends on the chat template; the rest is byte-exact.
PROMPT_TOO_LONG = re.compile(
    r"The prompt is (30\d\d) tokens but the context window is 2048 tokens; "
    r"shorten the messages \(it must leave room for at least one new token\)\."
)
PARSE = "There was an error parsing the body"
E11 = "Invalid URL: 403: Access to private or reserved IP addresses is not allowed."


def raw_chat(extra: bytes) -> bytes:
    """A valid one-message chat body with raw JSON text appended as the last field(s)."""
    return b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], ' + extra + b"}"


def text_items(*items: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(items)}


# (path, body: dict, or bytes sent raw, content type, status, detail): the detail is exact, a
# pattern for the whole string, or None for "any JSON body" (a 200 or a 422 list).
FUZZ = [
    pytest.param(CHAT, b'{"model": "\xff\xfe"}', JSON, 400, PARSE, id="invalid-utf8"),
    pytest.param(CHAT, b"\x00\x01\xfe\xff\x80garbage", JSON, 422, None, id="binary-as-json"),
    pytest.param(
        CHAT,
        b"\x00\x01\xfe\xff\x80garbage",
        "application/octet-stream",
        422,
        None,
        id="binary-octet-stream",
    ),
    pytest.param(CHAT, b"[" * 100_000, JSON, 400, PARSE, id="nesting-100k"),
    pytest.param(
        CHAT,
        raw_chat(b'"x": ' + b"[" * 400 + b"]" * 400 + b', "max_tokens": 1'),
        JSON,
        200,
        None,
        id="deep-ignored-field",
    ),
    pytest.param(
        CHAT,
        raw_chat(b'"logit_bias": {"1": ' + b"[" * 400 + b"]" * 400 + b"}"),
        JSON,
        422,
        None,
        id="deep-garbage-in-field",
    ),
    pytest.param(
        CHAT,
        chat(text_items({"type": "text", "text": {"a": [[[{}]]]}})),
        JSON,
        422,
        None,
        id="nested-garbage-text",
    ),
    pytest.param(
        CHAT, chat(USER, n=10**6), JSON, 400, OVER.format(n="n", v=10**6, limit=16), id="n-huge"
    ),
    pytest.param(
        CHAT, chat(USER, n=10**30), JSON, 400, OVER.format(n="n", v=10**30, limit=16), id="n-bigint"
    ),
    pytest.param(
        CHAT,
        chat(USER, n=9),
        JSON,
        400,
        "n: 9 exceeds this server's limit of 8; lower it.",
        id="n-over-parallel",
    ),
    pytest.param(CHAT, chat(USER, n=0), JSON, 400, POSITIVE.format(n="n", v=0), id="n-0"),
    pytest.param(CHAT, chat(USER, n=-2), JSON, 400, POSITIVE.format(n="n", v=-2), id="n-neg"),
    pytest.param(
        CHAT,
        chat(USER, max_tokens=0),
        JSON,
        400,
        POSITIVE.format(n="max_tokens", v=0),
        id="max_tokens-0",
    ),
    pytest.param(
        CHAT,
        chat(USER, max_tokens=-1),
        JSON,
        400,
        POSITIVE.format(n="max_tokens", v=-1),
        id="max_tokens-neg",
    ),
    pytest.param(
        CHAT,
        chat(USER, max_completion_tokens=0, max_tokens=5),
        JSON,
        400,
        POSITIVE.format(n="max_completion_tokens", v=0),
        id="max_completion_tokens-0",
    ),
    pytest.param(
        CHAT,
        chat(USER, max_tokens=10**12, logit_bias=EOS_NOW),
        JSON,
        200,
        None,
        id="max_tokens-1e12",
    ),
    pytest.param(
        CHAT,
        raw_chat(b'"temperature": NaN'),
        JSON,
        400,
        FINITE.format(n="temperature", v="nan"),
        id="temperature-NaN",
    ),
    pytest.param(
        CHAT,
        raw_chat(b'"top_p": 1e999'),
        JSON,
        400,
        FINITE.format(n="top_p", v="inf"),
        id="top_p-inf",
    ),
    pytest.param(
        CHAT,
        chat(USER, seed=2**64),
        JSON,
        400,
        BETWEEN.format(n="seed", lo=-(2**63), hi=2**63 - 1, v=2**64),
        id="seed-2**64",
    ),
    pytest.param(
        CHAT,
        chat(USER, presence_penalty=3),
        JSON,
        400,
        BETWEEN.format(n="presence_penalty", lo=-2.0, hi=2.0, v=3.0),
        id="presence-3",
    ),
    pytest.param(
        CHAT,
        chat(USER, logit_bias={"abc": 1}),
        JSON,
        400,
        '"logit_bias" keys must be token ids written as decimal integers of at most 9 '
        'digits, got "abc".',
        id="logit_bias-key",
    ),
    pytest.param(
        CHAT,
        chat(USER, response_format={"type": "json_schema"}),
        JSON,
        400,
        '"response_format" has type "json_schema" but no "json_schema"; add the schema object.',
        id="json_schema-missing",
    ),
    pytest.param(
        CHAT,
        chat({"role": "user", "content": None}),
        JSON,
        400,
        NULL_CONTENT.format(i=0),
        id="null-content",
    ),
    pytest.param(
        CHAT, chat({"role": "user"}), JSON, 400, NULL_CONTENT.format(i=0), id="missing-content"
    ),
    pytest.param(
        CHAT,
        chat(USER, {"role": "assistant", "content": None}, USER),
        JSON,
        400,
        NULL_CONTENT.format(i=1),
        id="null-assistant-content",
    ),
    pytest.param(
        CHAT,
        chat(text_items({"type": "text"})),
        JSON,
        400,
        NO_TEXT.format(j=0),
        id="text-item-without-text",
    ),
    pytest.param(
        CHAT,
        chat(text_items({"type": "text", "text": "a"}, {"type": "text", "text": None})),
        JSON,
        400,
        NO_TEXT.format(j=1),
        id="text-item-null-text",
    ),
    pytest.param(
        CHAT,
        chat(text_items({"type": "text", "text": "a"}, {"type": "image_url"})),
        JSON,
        400,
        NO_URL.format(k="image_url"),
        id="image-item-without-url",
    ),
    pytest.param(
        CHAT,
        chat(
            text_items(
                {"type": "text", "text": "a"}, {"type": "audio_url", "image_url": {"url": PNG}}
            )
        ),
        JSON,
        400,
        NO_URL.format(k="audio_url"),
        id="audio-item-with-wrong-url-key",
    ),
    pytest.param(
        CHAT,
        chat(USER, tools=[{"type": "function", "function": None}]),
        JSON,
        400,
        NO_FUNCTION.format(i=0),
        id="tool-function-null",
    ),
    pytest.param(
        CHAT,
        chat(USER, tools=[TOOL, {"type": "code_interpreter"}]),
        JSON,
        400,
        NO_FUNCTION.format(i=1),
        id="tool-without-function",
    ),
    pytest.param(
        CHAT,
        chat(media("data:image/png;base64,!!!!")),
        JSON,
        400,
        BAD_BASE64.format(k="image_url"),
        id="bad-base64",
    ),
    pytest.param(
        CHAT,
        chat(media("data:audio/wav;base64,=", "audio_url")),
        JSON,
        400,
        BAD_BASE64.format(k="audio_url"),
        id="bad-base64-audio",
    ),
    pytest.param(
        CHAT,
        chat(media(PNG)),
        JSON,
        400,
        TEXT_ONLY.format(what="an image", plural="images"),
        id="image-for-text-model",
    ),
    pytest.param(
        CHAT,
        chat(media("data:video/mp4;base64,AAAA", "video_url")),
        JSON,
        400,
        VIDEO,
        id="video-for-text-model",
    ),
    pytest.param(
        CHAT,
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        JSON,
        400,
        SURROGATE.format(w="messages[0]"),
        id="lone-surrogate-content",
    ),
    pytest.param(
        CHAT,
        b'{"model": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}',
        JSON,
        400,
        SURROGATE.format(w="model"),
        id="lone-surrogate-model",
    ),
    pytest.param(
        CHAT,
        b'{"model": "m", "messages": "\\ud800"}',
        JSON,
        422,
        None,
        id="lone-surrogate-in-422-echo",
    ),
    pytest.param(
        CHAT,
        chat({"role": "user", "content": "word " * 3000}),
        JSON,
        400,
        PROMPT_TOO_LONG,
        id="context-overflow",
    ),
    pytest.param(
        SCORE,
        {"model": "m", "messages": ["a"] * 300},
        JSON,
        400,
        '"messages" has 300 texts but this server scores at most 256 per request; '
        "split the request.",
        id="score-too-many-texts",
    ),
    pytest.param(SCORE, {"model": "m", "messages": [""]}, JSON, 200, None, id="score-empty-text"),
    pytest.param(SCORE, b"\xff", JSON, 400, PARSE, id="score-invalid-utf8"),
]


@pytest.mark.parametrize(("path", "body", "ctype", "status", "text"), FUZZ)
async def test_no_500_for_client_input(client, path, body, ctype, status, text):
    if isinstance(body, bytes):
        reply = await send(client, "POST", path, raw=body, ctype=ctype)
    else:
        reply = await post(client, path, {"max_tokens": 1, **body}, ctype=ctype)
    check_error(reply, status, text)


def check_error(reply: Reply, status: int, text: str | re.Pattern[str] | None) -> None:
    if isinstance(text, re.Pattern):
        assert text.fullmatch(reply.json()["detail"]), reply.body
        text = reply.json()["detail"]
    if text is not None:
        assert_error(reply, status, detail(text))
    else:
        assert reply.status == status, reply.body
        assert reply.headers["Content-Type"] == JSON
        data = json.loads(reply.body)
        assert ("detail" in data) == (status != 200)


# Chat bodies whose stream:true variant must still be a clean JSON error: (body, status, detail)
STREAM_ERRORS = [
    pytest.param(chat(USER, n=2), 400, "Cannot stream multiple responses.", id="S2"),
    pytest.param(
        chat(USER, tools=[TOOL], n=2), 400, "Cannot stream multiple responses.", id="S2-tools"
    ),
    pytest.param(chat(USER, n=16), 400, "Cannot stream multiple responses.", id="S2-16"),
    pytest.param(chat(USER, n=0), 400, POSITIVE.format(n="n", v=0), id="n-0"),
    pytest.param(
        chat(USER, max_tokens=0), 400, POSITIVE.format(n="max_tokens", v=0), id="max_tokens-0"
    ),
    pytest.param(
        chat({"role": "user", "content": None}), 400, NULL_CONTENT.format(i=0), id="null-content"
    ),
    pytest.param(
        chat(media(PNG)),
        400,
        TEXT_ONLY.format(what="an image", plural="images"),
        id="text-only-model",
    ),
    pytest.param(
        chat({"role": "user", "content": "word " * 3000}),
        400,
        PROMPT_TOO_LONG,
        id="context-overflow-after-admission",
    ),
]


@pytest.mark.parametrize(("body", "status", "text"), STREAM_ERRORS)
async def test_stream_errors_are_json_before_any_sse_byte(client, body, status, text):
    reply = await post(client, CHAT, {**body, "stream": True})
    check_error(reply, status, text)
    assert b"data:" not in reply.body


async def test_stream_with_empty_tools_list_streams(client):
    reply = await post(client, CHAT, chat(USER, stream=True, tools=[], n=1, max_tokens=1))
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert reply.body.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_over_the_limit_is_413(client, chunked):
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": "' + b"a" * (33 << 20) + b'"}]}'
    )
    if chunked:

        async def pieces():
            for start in range(0, len(body), 1 << 20):
                yield body[start : start + (1 << 20)]

        async with client.post(CHAT, data=pieces(), headers={"Content-Type": JSON}) as resp:
            status, ctype, raw = resp.status, resp.headers["Content-Type"], await resp.read()
    else:
        async with client.post(CHAT, data=io.BytesIO(body), headers={"Content-Type": JSON}) as resp:
            assert resp.request_info.headers.get("Content-Length") == str(len(body))
            status, ctype, raw = resp.status, resp.headers["Content-Type"], await resp.read()
    assert (status, ctype) == (413, JSON)
    assert raw == detail(
        "The request body is larger than this server's limit of 33554432 bytes; "
        "send a smaller request."
    )


@pytest.mark.parametrize("path", ["cat.png", "missing.png", "folder", "../cat.png", "rel.png"])
async def test_with_local_files_disabled_every_path_is_e7(make_client, monkeypatch, tmp_path, path):
    # The reference answers E7 for an existing file only (E9 otherwise): a file-existence oracle.
    (tmp_path / "safe").mkdir()
    (tmp_path / "safe" / "cat.png").write_bytes(b"\x89PNG")
    (tmp_path / "safe" / "folder").mkdir()
    monkeypatch.setenv("ALLOW_LOCAL_FILES", "0")
    monkeypatch.setenv("SAFE_MEDIA_PATH", str(tmp_path / "safe"))
    client = await make_client()
    url = path if path == "rel.png" else str(tmp_path / "safe" / path)
    reply = await post(client, CHAT, chat(media(url)))
    assert_error(reply, 403, detail("Local file access is disabled."))


@pytest.mark.parametrize(
    ("url", "status", "text"),
    [
        pytest.param(
            "http://1572394766/x.png",  # 93.184.215.14, which the reference would fetch
            400,
            "Invalid URL: the host 1572394766 ends in a number but is not an IPv4 address "
            "written as four decimal numbers (a.b.c.d)",
            id="numeric-public-host-E13",
        ),
        pytest.param("http://127.1/x.png", 400, E11, id="numeric-private-host-E11"),
        pytest.param("http://[64:ff9b::7f00:1]/x.png", 400, E11, id="nat64-loopback-E11"),
        pytest.param(
            "http://images.example.test/x.png",  # the reference: E12 after a lookup
            400,
            TEXT_ONLY.format(what="an image", plural="images"),
            id="text-only-model-no-lookup",
        ),
    ],
)
async def test_media_url_divergences(client, url, status, text):
    assert_error(await post(client, CHAT, chat(media(url))), status, detail(text))
