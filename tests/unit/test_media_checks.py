"""Media in requests (api/common/media.py and each API's translate.py), no model: content items
to the engine's ChatTurns (one MEDIA_MARKER per item where it sits, the bytes in order, across
messages), the limits, every refusal with its status and detail, and its place among the
reference's checks. Downloads and lookups go to `Fetched`, a MediaFetcher that answers from
dicts and records every lookup (also one that bypasses it: see `no_dns`).

The reference's own media errors for a text-only model are in test_reference_checks.py.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from edgeserve.api.anthropic_messages.translate import prepare_count_tokens, prepare_messages
from edgeserve.api.anthropic_messages.wire import CountTokensRequest, MessagesRequest
from edgeserve.api.common.media import MediaSource, read_media
from edgeserve.api.openai_chat.routes import ChatApi
from edgeserve.api.openai_chat.translate import parse_chat_request, prepare_chat
from edgeserve.api.openai_responses.translate import parse_responses_request, prepare_responses
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.fetcher import FetchError
from edgeserve.api.reference.limits import Limits
from edgeserve.engine.types import MEDIA_MARKER, ChatPrompt, ChatTurn, Media
from edgeserve.errors import ApiError

M = MEDIA_MARKER
PNG = b"\x89PNG\r\n\x1a\nfake png"
JPEG = b"\xff\xd8\xff\xe0fake jpeg"
WAV = b"RIFF....WAVEfmt fake wav"
URL_PRIVATE = "Invalid URL: 403: Access to private or reserved IP addresses is not allowed."
URL_SCHEME = "Invalid URL: 400: Only HTTP/HTTPS URLs are allowed."
TEXT_ONLY_IMAGE = Detail.MEDIA_TEXT_ONLY.format(
    where="messages[0].content[0]", what="an image", plural="images"
)
REMOTE = "http://93.184.215.14/cat.jpg"  # a public IP literal: checked without a DNS lookup


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


class Fetched:
    """A MediaFetcher answering downloads from `bodies` (a FetchError is raised) and lookups
    from `names` (others do not resolve); records what it got."""

    def __init__(self, **bodies: bytes | FetchError) -> None:
        self.bodies = {REMOTE: JPEG, **bodies}
        self.asked: list[tuple[str, int]] = []
        self.names = {"cdn.test": ["93.184.215.14"]}
        self.lookups: list[str] = []

    async def fetch(self, url: str, limit: int) -> bytes:
        self.asked.append((url, limit))
        body = self.bodies[url]
        if isinstance(body, FetchError):
            raise body
        return body

    async def addresses(self, host: str) -> list[str]:
        self.lookups.append(host)
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.names[host]


@pytest.fixture
def fetched() -> Fetched:
    return Fetched()


@pytest.fixture(autouse=True)
def no_dns(monkeypatch, fetched: Fetched) -> None:
    """getaddrinfo of a host name (a lookup that bypasses the fetcher) is recorded in
    `fetched.lookups` too, and fails: no test reaches a DNS server."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            fetched.lookups.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def limits(tmp_path: Path, fetched: Fetched) -> Limits:
    """A server whose model takes images."""
    return Limits(media_kinds=frozenset({"image"}), safe_media_path=str(tmp_path), fetcher=fetched)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def item(kind: str, url: str) -> dict[str, Any]:
    return {"type": kind, kind: {"url": url}}


def input_audio(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    return {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt},
    }


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any = "ok") -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **fields}


async def chat_turns(body: dict[str, Any], limits: Limits) -> tuple[ChatTurn, ...]:
    req = ChatApi().parse(body, limits)
    prompt = (await prepare_chat(req, limits)).prompt
    assert isinstance(prompt, ChatPrompt)
    return prompt.messages


async def chat_error(body: dict[str, Any], limits: Limits) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await chat_turns(body, limits)
    return caught.value


# --- OpenAI chat: content to turns -----------------------------------------------------------


async def test_each_item_becomes_a_marker_where_it_sits_and_its_bytes_in_order(limits, fetched):
    body = chat(
        user([text("What is in "), image(data_url(PNG)), text(" and "), image(REMOTE), text("?")]),
        assistant("A cat and a dog."),
        user([image(data_url(JPEG, "image/jpeg")), image(data_url(PNG)), text("Same?")]),
    )
    turns = await chat_turns(body, limits)
    assert turns == (
        ChatTurn("user", f"What is in {M} and {M}?", (Media("image", PNG), Media("image", JPEG))),
        ChatTurn("assistant", "A cat and a dog."),
        ChatTurn("user", f"{M}{M}Same?", (Media("image", JPEG), Media("image", PNG))),
    )
    assert fetched.asked == [(REMOTE, limits.max_media_bytes)]


@pytest.mark.parametrize(
    "mime", ["image/png", "image/jpg", "image/jpeg", "image/gif", "image/bmp", "image/webp"]
)
async def test_data_urls_the_model_takes(limits, mime):
    turns = await chat_turns(chat(user([image(data_url(PNG, mime))])), limits)
    assert turns[0].media == (Media("image", PNG),)


async def test_webp_stays_the_references_e9_for_a_text_only_model(limits):
    text_only = replace(limits, media_kinds=frozenset())
    error = await chat_error(chat(user([image(data_url(PNG, "image/webp"))])), text_only)
    assert (error.status, error.detail) == (400, URL_SCHEME)


async def test_a_local_file_inside_the_safe_folder_is_read(limits, tmp_path):
    (tmp_path / "cat.png").write_bytes(PNG)
    turns = await chat_turns(chat(user([image(str(tmp_path / "cat.png"))])), limits)
    assert turns[0] == ChatTurn("user", M, (Media("image", PNG),))


async def test_the_system_message_keeps_the_references_first_text_only(limits):
    system = {"role": "system", "content": [text("Be brief."), image(data_url(PNG))]}
    req = parse_chat_request(chat(system, user("hi")))
    prompt = (await prepare_chat(req, limits)).prompt
    assert isinstance(prompt, ChatPrompt)
    assert (prompt.system, prompt.messages) == ("Be brief.", (ChatTurn("user", "hi"),))


async def test_audio_where_the_projector_hears(limits):
    hears = replace(limits, media_kinds=frozenset({"image", "audio"}))
    body = chat(
        user(
            [
                item("audio_url", data_url(WAV, "audio/wav")),
                text("and"),
                input_audio(WAV, "mp3"),
                image(data_url(PNG)),
                item("audio_url", data_url(WAV, "audio/flac")),
            ]
        )
    )
    turns = await chat_turns(body, hears)
    audio = Media("audio", WAV)
    assert turns[0] == ChatTurn(
        "user", f"{M}and{M}{M}{M}", (audio, audio, Media("image", PNG), audio)
    )


INPUT_AUDIO_422 = [
    {
        "type": "string_type",
        "loc": ["body", "messages", 0, "content", "str"],
        "msg": "Input should be a valid string",
        "input": [input_audio(WAV)],
    },
    {
        "type": "literal_error",
        "loc": ["body", "messages", 0, "content", "list[MultimodalInputItem]", 0, "type"],
        "msg": "Input should be 'text', 'image_url', 'video_url' or 'audio_url'",
        "input": "input_audio",
        "ctx": {"expected": "'text', 'image_url', 'video_url' or 'audio_url'"},
    },
]


@pytest.mark.parametrize("kinds", [(), ("image",)], ids=["text-only", "images"])
async def test_input_audio_is_the_references_422_unless_the_model_hears(limits, kinds):
    no_audio = replace(limits, media_kinds=frozenset(kinds))
    with pytest.raises(ApiError) as caught:
        ChatApi().parse(chat(user([input_audio(WAV)])), no_audio)
    assert (caught.value.status, caught.value.detail) == (422, INPUT_AUDIO_422)


# --- OpenAI chat: refusals -------------------------------------------------------------------

AUDIO_TO_IMAGES = (
    "messages[0].content[1] is audio, but this server's model takes text and images only (its "
    "--mmproj projector has no audio encoder); send text and images."
)
IMAGE_TO_AUDIO = (
    "messages[0].content[0] is an image, but this server's model takes text and audio only (its "
    "--mmproj projector has no image encoder); send text and audio."
)
VIDEO = (
    "messages[0].content[0] is a video, which this server does not take (llama.cpp's multimodal "
    "library reads video only through an external ffmpeg program); send frames of it as images."
)

REFUSALS = [
    (
        "audio to a model that only sees",
        chat(user([text("x"), item("audio_url", data_url(WAV, "audio/wav"))])),
        {"image"},
        400,
        AUDIO_TO_IMAGES,
    ),
    (
        "image to a model that only hears",
        chat(user([image(data_url(PNG))])),
        {"audio"},
        400,
        IMAGE_TO_AUDIO,
    ),
    ("video", chat(user([item("video_url", data_url(PNG, "video/mp4"))])), {"image"}, 400, VIDEO),
    ("video URL", chat(user([item("video_url", REMOTE)])), {"image"}, 400, VIDEO),
    (
        "the reference's E9 comes before video's refusal",
        chat(user([item("video_url", "ftp://h/v.mp4")])),
        {"image"},
        400,
        URL_SCHEME,
    ),
    (
        "input_audio without its object",
        chat(user([{"type": "input_audio"}])),
        {"audio"},
        400,
        'messages[0].content[0] has type "input_audio" but no "input_audio" object; add '
        '{"input_audio": {"data": "<base64>", "format": "wav"}} or remove the item.',
    ),
    (
        "input_audio that is not base64",
        chat(user([{"type": "input_audio", "input_audio": {"data": "!!!!", "format": "wav"}}])),
        {"audio"},
        400,
        "messages[0].content[0].input_audio.data is not valid base64 data; encode the file with "
        "standard base64.",
    ),
    (
        "a private URL (E11)",
        chat(user([image("http://10.0.0.1/cat.png")])),
        {"image"},
        400,
        URL_PRIVATE,
    ),
    (
        "too many images",
        chat(user([image(data_url(PNG))] * 9)),
        {"image"},
        400,
        "The request has 9 images and audio clips but this server takes at most 8 per request "
        "(--max-media-per-request); send fewer.",
    ),
    (
        "too many across messages",
        chat(user([image(data_url(PNG))] * 5), assistant(), user([image(REMOTE)] * 4)),
        {"image"},
        400,
        Detail.TOO_MANY_MEDIA.format(count=9, limit=8),
    ),
    (
        "a data URL over the size limit",
        chat(user([text("x"), image(data_url(b"x" * 101))])),
        {"image"},
        413,
        "messages[0].content[1]'s image is larger than this server's limit of 100 bytes "
        "(--max-media-bytes); send a smaller file.",
    ),
    (
        "a download that fails",
        chat(user([image("http://93.184.215.14/gone.png")])),
        {"image"},
        400,
        "Could not fetch messages[0].content[0]'s image: HTTP 404.",
    ),
    (
        "a download over the size limit",
        chat(user([image(REMOTE), image("http://93.184.215.14/huge.png")])),
        {"image"},
        413,
        Detail.MEDIA_TOO_LARGE.format(where="messages[0].content[1]", kind="image", limit=100),
    ),
]


@pytest.mark.parametrize(
    ("body", "kinds", "status", "detail"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
async def test_refusals(limits, fetched, body, kinds, status, detail):
    fetched.bodies["http://93.184.215.14/gone.png"] = FetchError("HTTP 404")
    fetched.bodies["http://93.184.215.14/huge.png"] = FetchError("big", too_large=True)
    small = replace(limits, media_kinds=frozenset(kinds), max_media_bytes=100)
    error = await chat_error(body, small)
    assert (error.status, error.detail) == (status, detail)


async def test_a_local_file_over_the_size_limit_is_a_413(limits, tmp_path):
    (tmp_path / "big.png").write_bytes(b"x" * 101)
    error = await chat_error(
        chat(user([image(str(tmp_path / "big.png"))])), replace(limits, max_media_bytes=100)
    )
    assert (error.status, error.detail) == (
        413,
        Detail.MEDIA_TOO_LARGE.format(where="messages[0].content[0]", kind="image", limit=100),
    )


async def test_a_file_that_cannot_be_read_is_a_400(limits, tmp_path):
    gone = MediaSource("image", "messages[2].content[0]", path=str(tmp_path / "gone.png"))
    with pytest.raises(ApiError) as caught:
        await read_media([gone], limits)
    assert (caught.value.status, caught.value.detail) == (
        400,
        "Could not read messages[2].content[0]'s image from its file: No such file or directory.",
    )


async def test_without_a_fetcher_a_url_is_a_400(limits):
    error = await chat_error(chat(user([image(REMOTE)])), replace(limits, fetcher=None))
    assert error.detail == (
        "Could not fetch messages[0].content[0]'s image: this server downloads no media URLs."
    )


async def test_private_urls_pass_the_check_with_the_switch(limits, fetched):
    fetched.bodies["http://10.0.0.1/cat.png"] = PNG
    relaxed = replace(limits, allow_private_media_urls=True)
    turns = await chat_turns(chat(user([image("http://10.0.0.1/cat.png")])), relaxed)
    assert turns[0].media == (Media("image", PNG),)


async def test_a_host_name_is_looked_up_through_the_fetcher(limits, fetched):
    fetched.bodies["http://cdn.test/cat.png"] = PNG
    turns = await chat_turns(chat(user([image("http://cdn.test/cat.png")])), limits)
    assert turns[0].media == (Media("image", PNG),)
    assert fetched.lookups == ["cdn.test"]


# IPv6 forms of loopback, private and metadata addresses that carry them as IPv4 addresses.
CARRIERS = [
    "::127.0.0.1",
    "::ffff:0:7f00:1",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::a00:1",
    "2002:a9fe:a9fe::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "fec0::1",
]


@pytest.mark.parametrize("address", CARRIERS)
async def test_ipv6_forms_that_carry_an_ipv4_address_are_e11(limits, fetched, address):
    fetched.names["carrier.test"] = [address]
    for url in (f"http://[{address}]/x.png", "http://carrier.test/x.png"):
        error = await chat_error(chat(user([image(url)])), limits)
        assert (error.status, error.detail) == (400, URL_PRIVATE)
    assert fetched.asked == []


async def test_every_address_of_a_name_is_judged(limits, fetched):
    # The reference judges the first getaddrinfo answer only.
    fetched.names["mixed.test"] = ["93.184.215.14", "10.0.0.1"]
    error = await chat_error(chat(user([image("http://mixed.test/x.png")])), limits)
    assert (error.status, error.detail) == (400, URL_PRIVATE)


NUMERIC_PRIVATE = ["2130706433", "127.1", "0177.0.0.1", "0x7f.1", "0", "0x0a.1"]


@pytest.mark.parametrize("host", NUMERIC_PRIVATE)
async def test_a_numeric_host_that_reads_as_a_private_address_is_e11(limits, fetched, host):
    error = await chat_error(chat(user([image(f"http://{host}:8080/x.png")])), limits)
    assert (error.status, error.detail) == (400, URL_PRIVATE)
    assert fetched.lookups == []


@pytest.mark.parametrize(
    ("host", "allow_private"),
    [("1572394766", False), ("127.1", True), ("127.0.0.1.", False), ("1.2.3.4.5", False)],
)
async def test_any_other_numeric_host_is_e13(limits, fetched, host, allow_private):
    # 1572394766 reads as 93.184.215.14, which the reference would fetch.
    relaxed = replace(limits, allow_private_media_urls=allow_private)
    error = await chat_error(chat(user([image(f"http://{host}/x.png")])), relaxed)
    assert (error.status, error.detail) == (
        400,
        Detail.URL_OTHER.format(error=Detail.NUMERIC_HOST.format(host=host)),
    )
    assert fetched.lookups == [] and fetched.asked == []


NAMES = [f"http://img{i}.test/x.png" for i in range(1000)]


@pytest.mark.parametrize(
    ("kinds", "items", "detail"),
    [
        ((), [image(url) for url in NAMES], TEXT_ONLY_IMAGE),
        (
            ("image",),
            [item("audio_url", url) for url in NAMES],
            Detail.MEDIA_KIND_UNSUPPORTED.format(
                where="messages[0].content[0]", what="audio", takes="images", kind="audio"
            ),
        ),
        (
            ("image",),
            [image(url) for url in NAMES[:9]],
            Detail.TOO_MANY_MEDIA.format(count=9, limit=8),
        ),
    ],
    ids=["1000 images, text-only model", "1000 audio URLs, images only", "9 images, limit 8"],
)
async def test_no_lookup_for_media_the_request_is_refused_for(
    limits, fetched, kinds, items, detail
):
    error = await chat_error(chat(user(items)), replace(limits, media_kinds=frozenset(kinds)))
    assert (error.status, error.detail) == (400, detail)
    assert fetched.lookups == []


async def test_the_count_limit_holds_across_messages_before_any_lookup(limits, fetched):
    body = chat(user([image(NAMES[0])] * 5), assistant(), user([image(NAMES[1])] * 4))
    error = await chat_error(body, limits)
    assert error.detail == Detail.TOO_MANY_MEDIA.format(count=9, limit=8)
    assert fetched.lookups == []
    within = chat(user([image(NAMES[0])] * 5), assistant(), user([image(NAMES[1])] * 3))
    assert (await chat_error(within, limits)).detail == "Could not resolve hostname: img0.test"
    assert fetched.lookups == ["img0.test"]


@pytest.mark.parametrize("url", ["http://localhost/x.png", "http://a.localhost:80/x"])
async def test_localhost_is_e11_without_a_lookup(limits, fetched, url):
    error = await chat_error(chat(user([image(url)])), limits)
    assert (error.status, error.detail) == (400, URL_PRIVATE)
    assert fetched.lookups == []


async def test_a_dot_invalid_name_is_e12_without_a_lookup(limits, fetched):
    error = await chat_error(chat(user([image("http://Gone.INVALID/x.png")])), limits)
    assert (error.status, error.detail) == (400, "Could not resolve hostname: gone.invalid")
    assert fetched.lookups == []


@pytest.mark.parametrize("kinds", [(), ("image",)], ids=["text-only", "images"])
async def test_with_local_files_disabled_a_path_gets_one_answer_and_no_disk_access(
    limits, tmp_path, monkeypatch, kinds
):
    secret = tmp_path / "secret.png"
    secret.write_bytes(PNG)
    touched: list[str] = []
    for name in ("stat", "lstat"):
        real = getattr(os, name)

        def spy(path: Any, *args: Any, real: Any = real, **kwargs: Any) -> Any:
            touched.append(str(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, spy)
    disabled = replace(limits, allow_local_files=False, media_kinds=frozenset(kinds))
    answers = set()
    for path in (secret, tmp_path / "missing.png", "secret.png", "//host/x.png"):
        error = await chat_error(chat(user([image(str(path))])), disabled)
        answers.add((error.status, error.detail))
    monkeypatch.undo()
    assert answers == {(403, "Local file access is disabled.")}
    assert not [path for path in touched if "secret" in path or "missing" in path]


PRECEDENCE = [
    (
        "the reference's role check in a later message beats the count limit",
        chat(user([image(data_url(PNG))] * 9), user("x"), user("y")),
        "Invalid role",
    ),
    (
        "the reference's E9 in a later message beats the size limit",
        chat(user([image(data_url(b"x" * 101))]), assistant(), user([image("ftp://x")])),
        URL_SCHEME,
    ),
    (
        "Cannot stream multiple responses beats audio the model does not take",
        chat(user([item("audio_url", data_url(WAV, "audio/wav"))]), stream=True, n=2),
        "Cannot stream multiple responses.",
    ),
    (
        "a refused kind beats the count limit",
        chat(user([image(REMOTE)] * 9 + [item("video_url", REMOTE)])),
        Detail.VIDEO_UNSUPPORTED.format(where="messages[0].content[9]"),
    ),
    (
        "a bad sampling value beats a download",
        chat(user([image(REMOTE)]), temperature=-1),
        '"temperature" must be at least 0.0, got -1.0.',
    ),
]


@pytest.mark.parametrize(
    ("body", "detail"),
    [case[1:] for case in PRECEDENCE],
    ids=[case[0] for case in PRECEDENCE],
)
async def test_precedence(limits, fetched, body, detail):
    error = await chat_error(body, replace(limits, max_media_bytes=100))
    assert error.detail == detail
    assert fetched.asked == []  # nothing is downloaded for a request that fails its checks


# --- Anthropic Messages ------------------------------------------------------------------------


def image_block(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


def base64_source(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "base64", "media_type": mime, "data": base64.b64encode(data).decode()}


def messages_request(*messages: dict[str, Any]) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "messages": messages})


async def messages_turns(req: MessagesRequest, limits: Limits) -> tuple[ChatTurn, ...]:
    prompt = (await prepare_messages(req, limits)).prompt
    assert isinstance(prompt, ChatPrompt)
    return prompt.messages


async def test_anthropic_image_blocks(limits, fetched):
    use = {"type": "tool_use", "id": "t1", "name": "look", "input": {}}
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [
            {"type": "text", "text": "Here:"},
            image_block(base64_source(JPEG, "image/jpeg")),
        ],
    }
    req = messages_request(
        user([image_block(base64_source(PNG, "image/webp")), {"type": "text", "text": "What?"}]),
        assistant([use]),
        user([{"type": "text", "text": "And this?"}, result]),
        assistant("A dog."),
        user(
            [
                {"type": "text", "text": "Also"},
                {"type": "text", "text": "this:"},
                image_block({"type": "url", "url": REMOTE}),
            ]
        ),
    )
    turns = await messages_turns(req, limits)
    # Blank lines between texts, none beside an image (as chat's items).
    assert turns[0] == ChatTurn("user", f"{M}What?", (Media("image", PNG),))
    # A tool turn: the results first, then the message's text (see _messages_turn).
    assert turns[2] == ChatTurn("tool", f"Here:{M}\n\nAnd this?", (Media("image", JPEG),))
    assert turns[4] == ChatTurn("user", f"Also\n\nthis:{M}", (Media("image", JPEG),))
    assert fetched.asked == [(REMOTE, limits.max_media_bytes)]


ANTHROPIC_REFUSALS = [
    (
        "a text-only model",
        user([image_block(base64_source(PNG))]),
        frozenset(),
        Detail.MEDIA_TEXT_ONLY.format(
            where="messages[0].content[0]", what="an image", plural="images"
        ),
    ),
    (
        "a file source",
        user([{"type": "text", "text": "x"}, image_block({"type": "file", "file_id": "f"})]),
        None,
        'messages[0].content[1] is an image with source type "file": this server keeps no files; '
        'send it as {"type": "base64", ...} or {"type": "url", ...}.',
    ),
    (
        "bad base64",
        user([image_block({"type": "base64", "media_type": "image/png", "data": "!!!"})]),
        None,
        "messages[0].content[0].source.data is not valid base64 data; encode the file with "
        "standard base64.",
    ),
    (
        "a private URL",
        user([image_block({"type": "url", "url": "http://127.0.0.1/x"})]),
        None,
        URL_PRIVATE,
    ),
    (
        "a URL that is not http",
        user([image_block({"type": "url", "url": "file:///etc/passwd"})]),
        None,
        URL_SCHEME,
    ),
    (
        "an image in a tool result, for a text-only model",
        user(
            [
                {
                    "type": "tool_result",
                    "tool_use_id": "t",
                    "content": [image_block(base64_source(PNG))],
                }
            ]
        ),
        frozenset(),
        Detail.MEDIA_TEXT_ONLY.format(
            where="messages[0].content[0].content[0]", what="an image", plural="images"
        ),
    ),
]


@pytest.mark.parametrize(
    ("message", "kinds", "detail"),
    [case[1:] for case in ANTHROPIC_REFUSALS],
    ids=[case[0] for case in ANTHROPIC_REFUSALS],
)
async def test_anthropic_refusals(limits, message, kinds, detail):
    if kinds is not None:
        limits = replace(limits, media_kinds=kinds)
    if message["content"][0]["type"] == "tool_result":  # answers a call the assistant made
        use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
        req = messages_request(user("go"), assistant([use]), message)
        detail = detail.replace("messages[0]", "messages[2]")
    else:
        req = messages_request(message)
    with pytest.raises(ApiError) as caught:
        await prepare_messages(req, limits)
    assert (caught.value.status, caught.value.detail) == (400, detail)


async def test_anthropic_images_are_counted_before_any_lookup(limits, fetched):
    url_blocks = [image_block({"type": "url", "url": url}) for url in NAMES[:9]]
    use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": url_blocks[:5]}
    req = messages_request(user("go"), assistant([use]), user([result, *url_blocks[5:]]))
    with pytest.raises(ApiError) as caught:
        await prepare_messages(req, limits)
    assert caught.value.detail == Detail.TOO_MANY_MEDIA.format(count=9, limit=8)
    assert fetched.lookups == []


async def test_anthropic_image_in_an_assistant_message(limits):
    req = messages_request(user("x"), assistant([image_block(base64_source(PNG))]), user("y"))
    with pytest.raises(ApiError) as caught:
        await prepare_messages(req, limits)
    assert caught.value.detail == (
        'messages[1].content[0] is an "image" block in a message of role "assistant"; images '
        "belong in user messages (or in tool_result blocks)."
    )


async def test_anthropic_size_limit_and_count_tokens_take_the_images(limits):
    big = messages_request(user([image_block(base64_source(b"x" * 101))]))
    with pytest.raises(ApiError) as caught:
        await prepare_messages(big, replace(limits, max_media_bytes=100))
    assert caught.value.status == 413
    body = {"model": "m", "messages": [user([image_block(base64_source(PNG))])]}
    prompt = await prepare_count_tokens(CountTokensRequest.model_validate(body), limits)
    assert prompt.messages == (ChatTurn("user", M, (Media("image", PNG),)),)


# --- OpenAI Responses --------------------------------------------------------------------------


def input_image(url: str) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, "detail": "auto"}


async def test_responses_input_images(limits):
    body = {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "Compare"}, input_image(data_url(PNG))],
            },
            {"role": "user", "content": [input_image(REMOTE)]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": [input_image(data_url(JPEG))],
            },
        ],
    }
    work = await prepare_responses(parse_responses_request(body), limits)
    prompt = work.generation.prompt
    assert isinstance(prompt, ChatPrompt)
    assert prompt.messages[0] == ChatTurn(
        "user", f"Compare{M}\n\n{M}", (Media("image", PNG), Media("image", JPEG))
    )
    assert prompt.messages[2] == ChatTurn("tool", M, (Media("image", JPEG),))
