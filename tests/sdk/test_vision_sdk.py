"""Images and audio through the official `openai` and `anthropic` SDKs, unchanged, against a
server whose engine has the tiny projector (tests/fixtures/tiny_projector.py): an `image_url`
data URL and an `input_audio` clip in chat, `input_image` in Responses, an Anthropic `image`
block; each answer equals the engine's
own answer for the same conversation, and the usage counts llama.cpp's positions for it (the
image's included). Bad images are 400s the SDKs raise as BadRequestError, and a client that
leaves while its image is being encoded has its work stopped within a few steps."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import aiohttp
import anthropic
import openai
import pytest
from aiohttp.test_utils import TestServer

from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import (
    MEDIA_MARKER,
    ChatPrompt,
    ChatTurn,
    GenerationRequest,
    Media,
    SamplingParams,
    TextDelta,
)
from edgeserve.http.app import create_app
from tests.fixtures.tiny_projector import IMAGE_TOKENS, wav_bytes
from tests.integration.conftest import EOS_BAN
from tests.integration.engine_idle import assert_engine_idle, assert_left_work_stops
from tests.integration.vision import chat, image_bytes, image_turn, llama_cpp_positions
from tests.sdk.conftest import TIMEOUT_S, async_client

QUESTION = "What is in this picture? Answer briefly."
TOKENS = 6


@pytest.fixture
async def vision_server(aiohttp_server, vision_engine, settings) -> TestServer:
    """The app around the engine with the projector, on a real port."""
    return await aiohttp_server(create_app(settings, EngineClient(vision_engine)))


@pytest.fixture
async def oai(vision_server: TestServer) -> AsyncIterator[openai.AsyncOpenAI]:
    client = async_client(vision_server)
    yield client
    await client.close()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


async def engine_answer(engine, data: bytes) -> str:  # type: ignore[no-untyped-def]
    """The engine's own greedy answer to QUESTION after the image (no HTTP)."""
    return await engine_text(engine, chat(image_turn("", data, QUESTION)))


async def engine_text(engine, prompt: ChatPrompt) -> str:  # type: ignore[no-untyped-def]
    """The engine's own greedy answer to a conversation (no HTTP)."""
    request = GenerationRequest(prompt, SamplingParams(max_tokens=TOKENS, temperature=0))
    text = ""
    async with EngineClient(engine).generate(request) as generation:
        await generation.submit()
        async for event in generation.events():
            if isinstance(event, TextDelta):
                text += event.text
    return text


async def test_openai_chat_image_url_streamed_and_not(
    oai, vision_engine, model_path, projector
) -> None:
    image = image_bytes(101)
    expected = await engine_answer(vision_engine, image)
    conversation = chat(image_turn("", image, QUESTION))
    positions = llama_cpp_positions(
        model_path, projector, vision_engine.backend.render(conversation), [image]
    )
    assert positions.count(None) == IMAGE_TOKENS
    content = [
        {"type": "image_url", "image_url": {"url": data_url(image)}},
        {"type": "text", "text": QUESTION},
    ]
    messages = [{"role": "user", "content": content}]
    reply = await oai.chat.completions.create(
        model="m", messages=messages, max_tokens=TOKENS, temperature=0
    )
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens == len(positions)  # the image's positions count
    stream = await oai.chat.completions.create(
        model="m", messages=messages, max_tokens=TOKENS, temperature=0, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == expected


async def test_openai_chat_input_audio(oai, vision_engine) -> None:
    clip = wav_bytes(1.0, hertz=392.0)
    turn = ChatTurn("user", f"{MEDIA_MARKER}{QUESTION}", (Media("audio", clip),))
    expected = await engine_text(vision_engine, chat(turn))
    audio = {"data": base64.b64encode(clip).decode(), "format": "wav"}
    content = [{"type": "input_audio", "input_audio": audio}, {"type": "text", "text": QUESTION}]
    reply = await oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=TOKENS, temperature=0
    )
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens > 100  # the clip's positions count


async def test_openai_responses_input_image(oai, vision_engine) -> None:
    image = image_bytes(102)
    expected = await engine_answer(vision_engine, image)
    response = await oai.responses.create(
        model="m",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_url(image)},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
        max_output_tokens=TOKENS,
        temperature=0,
    )
    assert response.output_text == expected


async def test_anthropic_image_block(vision_server, vision_engine) -> None:
    image = image_bytes(103)
    expected = await engine_answer(vision_engine, image)
    client = anthropic.AsyncAnthropic(
        base_url=str(vision_server.make_url("")), api_key="x", max_retries=0, timeout=TIMEOUT_S
    )
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
    message = await client.messages.create(
        model="m",
        max_tokens=TOKENS,
        extra_body={"temperature": 0},  # anthropic 2.x's create() no longer takes it
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": source},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
    )
    await client.close()
    assert "".join(block.text for block in message.content if block.type == "text") == expected


@pytest.mark.parametrize(
    "payload",
    [b"not an image", image_bytes(104)[:100], None],
    ids=["garbage", "truncated", "bomb"],
)
async def test_bad_images_are_400s_and_the_server_goes_on(oai, vision_engine, payload) -> None:
    if payload is None:
        import io

        from PIL import Image

        out = io.BytesIO()
        Image.new("1", (20000, 20000)).save(out, "PNG")
        payload = out.getvalue()
    content = [{"type": "image_url", "image_url": {"url": data_url(payload)}}]
    with pytest.raises(openai.BadRequestError) as caught:
        await oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": content}], max_tokens=2
        )
    assert caught.value.status_code == 400
    good = [{"type": "image_url", "image_url": {"url": data_url(image_bytes(105))}}]
    reply = await oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": good}], max_tokens=2
    )
    assert reply.choices[0].message.content is not None


async def test_a_client_leaving_during_its_image_stops_its_work_and_leaves_the_engine_idle(
    vision_server, vision_engine, monkeypatch
) -> None:
    backend = vision_engine.backend
    encode = backend.encode_media
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_encode(*args):  # type: ignore[no-untyped-def]
        loop.call_soon_threadsafe(started.set)
        import time

        time.sleep(0.5)
        return encode(*args)

    monkeypatch.setattr(backend, "encode_media", slow_encode)
    url = data_url(image_bytes(106))
    body = {
        "model": "m",
        "max_tokens": 200,  # with no end of generation: far more steps than the abort takes
        "logit_bias": EOS_BAN,
        "stream": True,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}],
            }
        ],
    }
    async with aiohttp.ClientSession() as session:
        request = asyncio.ensure_future(
            session.post(vision_server.make_url("/v1/chat/completions"), json=body)
        )
        await asyncio.wait_for(started.wait(), 30)
        left_at = vision_engine.steps
        request.cancel()
    await assert_left_work_stops(vision_engine, left_at)
    await assert_engine_idle(vision_engine)
