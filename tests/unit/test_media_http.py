"""Media over HTTP, on the app with a stand-in engine (`StubEngine`, which records the prompts
it gets and answers "ok"): the limits follow the media the loaded model takes, URLs are
downloaded by the app's fetcher (from a second local server, with --allow-private-media-urls),
also when a large body's checks run off the event loop; host names are looked up only for
media the request can take, and lookups and downloads end with the request's deadline; and
/health, /v1/models and /tokenizer_info say what the model reads. Needs no model; the lead's
end-to-end tests run a real projector."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.fetcher import FetchError
from edgeserve.config import Settings
from edgeserve.engine.adapters import AdapterCatalog
from edgeserve.engine.types import (
    MEDIA_MARKER,
    ChatPrompt,
    EngineStats,
    Finished,
    GenerationRequest,
    Media,
    PromptInfo,
    TextDelta,
    TokenizerInfo,
)
from edgeserve.http.app import create_app
from edgeserve.http.keys import LIMITS
from edgeserve.http.media_fetch import HttpMediaFetcher
from edgeserve.http.request import LARGE_BODY_BYTES
from edgeserve.log import PROMPTS

PNG = b"\x89PNG\r\n\x1a\nfake png"
WAV = b"RIFF....WAVEfmt fake wav"


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


class StubGeneration:
    drafted = draft_accepted = 0

    def __init__(self, engine: StubEngine, request: GenerationRequest) -> None:
        self.engine = engine
        self.request = request

    async def __aenter__(self) -> StubGeneration:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def submit(self) -> PromptInfo:
        self.engine.prompts.append(self.request.prompt)
        return PromptInfo(prompt_tokens=5)

    async def events(self) -> AsyncIterator[TextDelta | Finished]:
        yield TextDelta(0, "ok", generated=1)
        yield Finished(0, "stop", completion_tokens=1)


@dataclass
class StubEngine:
    """What the HTTP layer uses of an EngineClient, for wire tests."""

    media_kinds: frozenset[str] = frozenset()
    prompts: list[Any] = field(default_factory=list)
    can_generate: bool = True
    loaded: bool = True
    adapters: AdapterCatalog = field(default_factory=AdapterCatalog)

    def stats(self) -> EngineStats:
        return EngineStats(
            loaded=True,
            n_ctx=2048,
            parallel=1,
            busy_slots=0,
            queue_length=0,
            gpu_offload=False,
            n_gpu_layers=0,
        )

    def generate(self, request: GenerationRequest) -> StubGeneration:
        return StubGeneration(self, request)

    async def count_prompt_tokens(self, prompt: ChatPrompt) -> int:
        self.prompts.append(prompt)
        return 7 + 100 * sum(len(turn.media) for turn in prompt.messages)

    def tokenizer_info(self) -> TokenizerInfo:
        return TokenizerInfo("llama", "<bos>", "<eos>", None, True, False, 40, 2048, "")


@pytest.fixture
def engine() -> StubEngine:
    return StubEngine()


@pytest.fixture
async def media_server(aiohttp_server):
    """Serves PNG at /cat.png, redirects /away to it, and answers /stalls only once the
    client has gone (or after 10 s)."""

    async def cat(request: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    async def away(request: web.Request) -> web.Response:
        raise web.HTTPFound("/cat.png")

    async def stalls(request: web.Request) -> web.Response:
        for _ in range(500):
            if request.transport is None or request.transport.is_closing():
                break
            await asyncio.sleep(0.02)
        return web.Response(body=PNG)

    app = web.Application()
    app.router.add_get("/cat.png", cat)
    app.router.add_get("/away", away)
    app.router.add_get("/stalls", stalls)
    return await aiohttp_server(app)


class SlowDns:
    """getaddrinfo, for host names ending in .test: each lookup recorded, and answered
    10.0.0.1 once `release` is set or after 5 s (a lookup that outlasts a short deadline)."""

    def __init__(self) -> None:
        self.lookups: list[str] = []
        self.release = threading.Event()

    def answer(self, host: str) -> list[tuple]:
        self.lookups.append(host)
        self.release.wait(5)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 0))]


@pytest.fixture
def dns(monkeypatch) -> Iterator[SlowDns]:
    slow = SlowDns()
    real = socket.getaddrinfo

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> list[tuple]:
        if isinstance(host, str) and host.endswith(".test"):
            return slow.answer(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield slow
    slow.release.set()


@pytest.fixture
def make_client(aiohttp_client, engine, tmp_path, monkeypatch):
    monkeypatch.setenv("SAFE_MEDIA_PATH", str(tmp_path))

    async def make(**overrides: Any):
        settings = Settings(model="m.gguf", **overrides)
        return await aiohttp_client(create_app(settings, engine))

    return make


def chat(*content: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": list(content)}]}


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


async def post(client, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = await client.post(path, json=body)
    return response.status, await response.json()


async def test_the_limits_follow_the_media_the_loaded_model_takes(make_client, engine):
    client = await make_client()
    body = chat({"type": "text", "text": "What is it?"}, image(data_url(PNG)))
    status, answer = await post(client, "/v1/chat/completions", body)
    assert status == 400
    assert "--mmproj PROJECTOR.gguf" in answer["detail"] and engine.prompts == []
    engine.media_kinds = frozenset({"image"})  # the model (and its projector) loaded
    status, answer = await post(client, "/v1/chat/completions", body)
    assert (status, answer["choices"][0]["message"]["content"]) == (200, "ok")
    [prompt] = engine.prompts
    assert prompt.messages[0].content == f"What is it?{MEDIA_MARKER}"
    assert prompt.messages[0].media == (Media("image", PNG),)


async def test_while_a_projector_loads_media_are_left_to_the_engine(make_client, engine):
    client = await make_client(mmproj="mmproj.gguf")  # the model has not loaded: no kinds yet
    status, _ = await post(client, "/v1/chat/completions", chat(image(data_url(PNG))))
    assert status == 200  # the real engine answers 503 until it has loaded
    assert engine.prompts[0].messages[0].media == (Media("image", PNG),)


async def test_input_audio_is_taken_once_the_model_hears(make_client, engine):
    client = await make_client()
    audio = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(WAV).decode(), "format": "wav"},
    }
    status, answer = await post(client, "/v1/chat/completions", chat(audio))
    assert status == 422 and answer["detail"][1]["type"] == "literal_error"
    engine.media_kinds = frozenset({"image", "audio"})
    status, _ = await post(client, "/v1/chat/completions", chat(audio))
    assert status == 200 and engine.prompts[0].messages[0].media == (Media("audio", WAV),)


async def test_a_url_is_downloaded_after_its_redirects(make_client, engine, media_server):
    engine.media_kinds = frozenset({"image"})
    client = await make_client(allow_private_media_urls=True)
    target = str(media_server.make_url("/away"))
    status, _ = await post(client, "/v1/chat/completions", chat(image(target)))
    assert status == 200
    assert engine.prompts[0].messages[0].media == (Media("image", PNG),)


async def test_a_large_body_downloads_on_the_apps_loop(make_client, engine, media_server):
    # Over LARGE_BODY_BYTES, the checks run on a worker thread's own event loop.
    engine.media_kinds = frozenset({"image"})
    client = await make_client(allow_private_media_urls=True)
    padding = {"type": "text", "text": "x" * LARGE_BODY_BYTES}
    body = chat(padding, image(str(media_server.make_url("/cat.png"))))
    status, _ = await post(client, "/v1/chat/completions", body)
    assert status == 200
    assert engine.prompts[0].messages[0].media == (Media("image", PNG),)


async def test_no_lookup_for_a_thousand_images_on_a_text_only_model(make_client, dns):
    dns.release.set()
    client = await make_client()
    images = [image(f"http://img{i}.test/x.png") for i in range(1000)]
    status, answer = await post(client, "/v1/chat/completions", chat(*images))
    assert status == 400 and "takes text only" in answer["detail"]
    assert dns.lookups == []


async def test_a_lookup_is_made_through_the_apps_fetcher(make_client, engine, dns):
    dns.release.set()
    engine.media_kinds = frozenset({"image"})
    client = await make_client()
    status, answer = await post(client, "/v1/chat/completions", chat(image("http://a.test/x")))
    assert (status, answer["detail"]) == (400, Detail.URL_PRIVATE)  # 10.0.0.1
    assert dns.lookups == ["a.test"]


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("slow", ["lookup", "download"])
async def test_lookups_and_downloads_end_with_the_requests_deadline(
    make_client, engine, dns, media_server, slow, size
):
    engine.media_kinds = frozenset({"image"})
    client = await make_client(
        request_timeout_s=0.5, media_fetch_timeout_s=5, allow_private_media_urls=slow == "download"
    )
    url = "http://slow.test/x.png" if slow == "lookup" else str(media_server.make_url("/stalls"))
    padding = [{"type": "text", "text": "x" * LARGE_BODY_BYTES}] if size == "large" else []
    status, answer = await post(client, "/v1/chat/completions", chat(*padding, image(url)))
    assert (status, answer["detail"]) == (504, Detail.REQUEST_TIMEOUT.format(seconds=0.5))
    assert engine.prompts == []


async def test_private_addresses_are_refused_by_default(make_client, engine, media_server):
    engine.media_kinds = frozenset({"image"})
    client = await make_client()
    status, answer = await post(
        client, "/v1/chat/completions", chat(image(str(media_server.make_url("/cat.png"))))
    )
    assert (status, answer["detail"]) == (
        400,
        "Invalid URL: 403: Access to private or reserved IP addresses is not allowed.",
    )


async def test_the_size_and_count_flags_reach_the_checks(make_client, engine):
    engine.media_kinds = frozenset({"image"})
    client = await make_client(max_media_bytes=10, max_media_per_request=2)
    status, answer = await post(client, "/v1/chat/completions", chat(image(data_url(PNG))))
    assert status == 413 and "limit of 10 bytes" in answer["detail"]
    small = data_url(b"GIF89a")
    status, answer = await post(client, "/v1/chat/completions", chat(*[image(small)] * 3))
    assert status == 400 and "at most 2 per request" in answer["detail"]


async def test_anthropic_images_and_count_tokens(make_client, engine):
    engine.media_kinds = frozenset({"image"})
    client = await make_client()
    block = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(PNG).decode(),
        },
    }
    body = {"model": "m", "messages": [{"role": "user", "content": [block]}]}
    status, answer = await post(client, "/v1/messages/count_tokens", body)
    assert (status, answer) == (200, {"input_tokens": 107})
    status, answer = await post(client, "/v1/messages", body | {"max_tokens": 4})
    assert status == 200 and answer["content"][0]["text"] == "ok"
    assert [p.messages[0].media for p in engine.prompts] == [(Media("image", PNG),)] * 2


async def test_anthropic_errors_keep_anthropics_shape(make_client, engine):
    client = await make_client()
    block = {"type": "image", "source": {"type": "url", "url": "http://93.184.215.14/x.png"}}
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [block]}]}
    status, answer = await post(client, "/v1/messages", body)
    assert status == 400 and answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"].startswith(
        "messages[0].content[0] is an image, but this server's model takes text only"
    )


async def test_responses_input_image(make_client, engine):
    engine.media_kinds = frozenset({"image"})
    client = await make_client()
    part = {"type": "input_image", "image_url": data_url(PNG)}
    body = {"model": "m", "input": [{"role": "user", "content": [part]}]}
    status, _ = await post(client, "/v1/responses", body)
    assert status == 200 and engine.prompts[0].messages[0].media == (Media("image", PNG),)


@pytest.mark.parametrize(
    ("kinds", "modalities"),
    [
        ((), ["text"]),
        (("image",), ["text", "image"]),
        (("audio", "image"), ["text", "image", "audio"]),
    ],
)
async def test_what_the_model_reads_is_shown(make_client, engine, kinds, modalities):
    engine.media_kinds = frozenset(kinds)
    client = await make_client(model_name="vlm")
    health = await (await client.get("/health")).json()
    info = await (await client.get("/tokenizer_info")).json()
    card = (await (await client.get("/v1/models")).json())["data"][0]
    assert health["input_modalities"] == info["input_modalities"] == modalities
    assert card.get("input_modalities", ["text"]) == modalities
    assert info["tokenizer_class"] == "llama" and health["status"] == "ok"


async def test_a_text_only_model_card_is_the_references(make_client):
    client = await make_client(model_name="m")
    body = await (await client.get("/v1/models")).read()
    card = json.loads(body)["data"][0]
    assert list(card) == ["id", "object", "created", "owned_by"]


async def test_the_fetcher_is_open_while_the_app_runs(aiohttp_client, engine):
    app = create_app(Settings(model="m.gguf"), engine)
    fetcher = app[LIMITS].fetcher
    assert isinstance(fetcher, HttpMediaFetcher)
    with pytest.raises(FetchError, match="not serving"):
        await fetcher.fetch("http://93.184.215.14/x.png", 10)
    client = await aiohttp_client(app)
    with pytest.raises(FetchError, match=r"127\.0\.0\.1 is a private"):
        await fetcher.fetch("http://127.0.0.1:1/x.png", 10)
    await client.close()
    with pytest.raises(FetchError, match="not serving"):
        await fetcher.fetch("http://93.184.215.14/x.png", 10)


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_the_prompt_log_shows_media_by_kind(make_client, engine):
    engine.media_kinds = frozenset({"image"})
    client = await make_client(log_prompts=True)
    body = chat(image(data_url(PNG)), {"type": "text", "text": "and"}, image(data_url(PNG)))
    logger, kept = logging.getLogger(PROMPTS), Kept()
    level, disabled = logger.level, logger.disabled  # as setup_logging left them
    logger.addHandler(kept)
    logger.setLevel(logging.DEBUG)
    logger.disabled = False  # as setup_logging(log_prompts=True) leaves it
    try:
        status, _ = await post(client, "/v1/chat/completions", body)
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
        logger.disabled = disabled
    assert status == 200
    [record] = kept.records
    assert json.loads(record.prompt) == [{"role": "user", "content": "<image>and<image>"}]
