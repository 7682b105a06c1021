"""Audio a client sends is judged from its header in Python before llama.cpp's helper (miniaudio)
sizes a buffer from it, and held to --max-media-tokens before anything is encoded.

A header that lies used to reach C++: a 42-byte FLAC declaring 2^36 - 1 samples threw
std::bad_alloc out of the helper and the process aborted (exit 134). So the refusals are driven
through a real server process with --mmproj, where an abort is a dead process rather than a
dead pytest; spies on libmtmd show what never reached it; the helper's own buffer sizes are
compared with the header reader's.
"""

from __future__ import annotations

import base64
import ctypes
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
import pytest

from edgeserve.engine.audio import read_audio
from edgeserve.engine.types import MEDIA_MARKER, ChatTurn, Media
from edgeserve.engine.worker import Engine
from edgeserve.errors import InvalidMedia, RequestTooLarge
from tests.conftest import vision_config
from tests.fixtures.audio_files import (
    LOW_RATE_HEADER,
    flac_bytes,
    mp3_bytes,
    wav_header_lying,
)
from tests.fixtures.tiny_projector import wav_bytes
from tests.integration.test_server_process import Server
from tests.integration.test_vision_engine import first_rows, greedy, reference, run
from tests.integration.vision import chat, image_bytes

__all__ = ["first_rows"]  # the fixture, shared with test_vision_engine

JSON = {"Content-Type": "application/json"}
HOUR_MP3 = mp3_bytes(3600, LOW_RATE_HEADER)  # 3.6 MB of silent 8 kbit/s frames


def bomb_png() -> bytes:
    """A 20000×20000 PNG of a few KB (stb_image would allocate 1.2 GB for it)."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("1", (20000, 20000)).save(out, "PNG")
    return out.getvalue()


def heard(clip: bytes, question: str = " What sound is it?") -> Any:
    return chat(ChatTurn("user", f"Hear this: {MEDIA_MARKER}{question}", (Media("audio", clip),)))


def chat_body(data: bytes, kind: str) -> io.BytesIO:
    """A chat request holding `data` as an audio data URL (a stream: it may be megabytes)."""
    url = f"data:audio/{kind};base64,{base64.b64encode(data).decode()}"
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "audio_url", "audio_url": {"url": url}},
    ]
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    return io.BytesIO(json.dumps(body).encode())


REFUSED = {
    "flac of 2^36 - 1 samples": (
        flac_bytes(total=2**36 - 1, frames=False),
        "flac",
        "holds 68719476735 samples, more than its 0 bytes of frames can",
    ),
    "flac of 2^31 samples": (
        flac_bytes(total=2**31, frames=False),
        "flac",
        "holds 2147483648 samples, more than its 0 bytes of frames can",
    ),
    "wav data chunk past the end": (
        wav_header_lying(2**31),
        "wav",
        "says its samples take 2147483648 bytes, but the file holds 320",
    ),
    "mp3 xing count": (
        mp3_bytes(1.0, xing_frames=2**32 - 1),
        "mpeg",
        "Xing/Info header says it holds 4294967295 frames, but it has 29",
    ),
    "an hour of mp3": (HOUR_MP3, "mp3", "lasts 3600 s (from its MP3 header), longer than"),
    "a png": (image_bytes(3), "wav", "not a WAV, MP3 or FLAC file"),
    "ogg": (b"OggS" + bytes(60), "ogg", "Ogg audio (Vorbis, Opus) cannot be read"),
}


async def test_lying_and_foreign_audio_are_400s_and_the_server_process_lives(
    model_path: Path, projector: Path
) -> None:
    server = Server(model_path, "--mmproj", str(projector), "--log-level", "warning")
    url = f"{server.url}/v1/chat/completions"
    try:
        async with aiohttp.ClientSession() as session:
            await server.wait_ready(session, timeout=120)
            for name, (data, kind, why) in REFUSED.items():
                try:
                    async with session.post(url, data=chat_body(data, kind), headers=JSON) as r:
                        status, body = r.status, await r.json()
                except aiohttp.ClientConnectionError:
                    pytest.fail(f"{name}: the server died (exit {server.proc.wait(timeout=30)})")
                assert server.proc.poll() is None, f"{name}: exit {server.proc.returncode}"
                assert status == 400, (name, body)
                assert body["detail"].startswith("media item 0 (audio): "), (name, body)
                assert why in body["detail"], (name, body)
            good = chat_body(wav_bytes(1.0), "wav")
            async with session.post(url, data=good, headers=JSON) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["choices"][0]["message"]["content"] is not None
    finally:
        code, err = server.stop()
    assert code == 0, err


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the projector called llama.cpp's audio/image file helper and its encoder."""
    calls = {"helper": 0, "encode": 0}
    helper, encode = mtmd.mtmd_helper_bitmap_init_from_buf, mtmd.mtmd_encode_chunk

    def counted_helper(*args: Any) -> Any:
        calls["helper"] += 1
        return helper(*args)

    def counted_encode(*args: Any) -> Any:
        calls["encode"] += 1
        return encode(*args)

    monkeypatch.setattr(mtmd, "mtmd_helper_bitmap_init_from_buf", counted_helper)
    monkeypatch.setattr(mtmd, "mtmd_encode_chunk", counted_encode)
    return calls


async def test_audio_that_cannot_fit_or_is_no_audio_never_reaches_the_helper_or_encoder(
    vision_engine: Engine, native_calls: dict[str, int]
) -> None:
    for data, why in (
        (HOUR_MP3, "lasts 3600 s (from its MP3 header), longer than the 40 s"),
        (bomb_png(), "not a WAV, MP3 or FLAC file"),
        (image_bytes(5), "not a WAV, MP3 or FLAC file"),
    ):
        with pytest.raises(InvalidMedia, match=r"media item 0 \(audio\): ") as caught:
            await run(vision_engine, greedy(heard(data)))
        assert why in str(caught.value)
    assert native_calls == {"helper": 0, "encode": 0}
    # Two 1 s clips: 750 positions each, 1000 for the request. The second is read and
    # tokenized (a 30 s chunk) but never encoded.
    both = chat(
        ChatTurn(
            "user",
            f"Two clips: {MEDIA_MARKER} and {MEDIA_MARKER}",
            (Media("audio", mp3_bytes(1.0)), Media("audio", flac_bytes(1.0, hertz=330.0))),
        )
    )
    with pytest.raises(RequestTooLarge) as too_many:
        await run(vision_engine, greedy(both))
    assert (too_many.value.got, too_many.value.limit) == (1500, 1000)
    assert native_calls == {"helper": 2, "encode": 1}
    _, finished = await run(vision_engine, greedy(heard(mp3_bytes(0.5)), 3))
    assert finished.completion_tokens > 0
    assert native_calls == {"helper": 3, "encode": 2}


def test_the_helpers_buffer_is_what_the_header_reader_says(vision_engine: Engine) -> None:
    projector = vision_engine.backend.projector
    rate = projector.audio.sample_rate
    files = {
        "wav": wav_bytes(1.0),
        "wav 44.1 kHz": wav_bytes(1.3, rate=44100),
        "flac": flac_bytes(1.0),
        "flac 22.05 kHz": flac_bytes(2.5, rate=22050),
        "mp3": mp3_bytes(1.0),
        "mp3 after an id3 tag": mp3_bytes(1.0, id3=True),
        "mp3 at 8 kbit/s": mp3_bytes(10.0, LOW_RATE_HEADER),
        "flac saying fewer samples than it holds": flac_bytes(1.0, total=4000),
        "wav data of an odd byte count": wav_header_lying(321, bytes(321)),
        "mp3 with a smaller xing count": mp3_bytes(1.0, xing_frames=5),
    }
    for name, data in files.items():
        predicted = read_audio(data).frames_at(rate)
        with projector._lock:
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(projector._ctx, buf, len(data), False)
            assert bitmap and mtmd.mtmd_bitmap_is_audio(bitmap), name
            samples = mtmd.mtmd_bitmap_get_n_bytes(bitmap) // 4
            mtmd.mtmd_bitmap_free(bitmap)
        if "xing" in name:  # dr_mp3 takes the tag's count (here the smaller): a bound
            assert samples < predicted, name
        else:
            assert samples == predicted, name


@pytest.fixture
def cold_engine(model_path: Path, projector: Path) -> Iterator[Engine]:
    """An engine of its own, its cache empty (bits compare with llama.cpp's fresh context)."""
    engine = Engine(vision_config(model_path, projector))
    engine.start()
    assert engine.wait_loaded(120), engine.load_error
    yield engine
    engine.close()


@pytest.mark.parametrize("clip", [mp3_bytes(1.0, id3=True), flac_bytes(1.0, hertz=523.0)])
async def test_mp3_and_flac_clips_answer_as_llama_cpps_own_path(
    cold_engine: Engine,
    model_path: Path,
    projector: Path,
    first_rows: dict[int, tuple[int, np.ndarray]],
    clip: bytes,
) -> None:
    prompt = heard(clip)
    ids, expected = reference(model_path, projector, cold_engine, prompt, [clip])
    assert ids.count(None) == 750
    request = greedy(prompt)
    await run(cold_engine, request)
    assert np.array_equal(first_rows[id(request)][1], expected)
