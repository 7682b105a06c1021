"""Images in the engine, against llama.cpp's own multimodal path run in the test.

The projector is written by the test (tests/fixtures/tiny_projector.py, fixed seed) and loaded
beside the real default model in an engine of this module's own. Logits are compared bit for
bit with llama.cpp (libmtmd's tokenizer and chunk evaluation on a fresh context) on an engine
of the test's own, whose cache is laid out as that fresh context (after other requests, a
sequence's logits move with where its cells sit); answers beside text streams are compared
with their solo runs (llama.cpp's repacked CPU kernels give a row other low bits in another
batch, text too), and every token of them is shown sampled in a decode that held a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgeserve.config import physical_cores
from edgeserve.engine.client import EngineClient
from edgeserve.engine.generating import Generating
from edgeserve.engine.types import (
    MEDIA_MARKER,
    ChatTurn,
    EngineConfig,
    Finished,
    GenerationRequest,
    Media,
    SamplingParams,
    TextDelta,
)
from edgeserve.engine.worker import Engine
from edgeserve.errors import InvalidMedia, RequestTooLarge
from tests.conftest import VISION_CTX as N_CTX
from tests.conftest import VISION_PARALLEL as PARALLEL
from tests.conftest import vision_config
from tests.fixtures.tiny_projector import IMAGE_TOKENS, wav_bytes, write_tiny_projector
from tests.integration.engine_idle import assert_engine_idle
from tests.integration.engine_run import collect
from tests.integration.vision import chat, image_bytes, image_turn, llama_cpp_logits

NO_END = {1: -100.0, 106: -100.0, 212: -100.0}  # Gemma's end-of-generation tokens banned
STREAM_TOKENS = 200  # a text stream's answer, cut once the pictures' answers are done


@pytest.fixture
def first_rows(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[int, np.ndarray]]:
    """The logits each request's first token was sampled from, and its lead sequence, by
    id() of its GenerationRequest."""
    rows: dict[int, tuple[int, np.ndarray]] = {}
    sampled = Generating._on_sampled

    def spy(self, job, choice, token, row):  # type: ignore[no-untyped-def]
        if choice.n_gen == 0 and choice.index == 0:
            rows.setdefault(id(job.request), (choice.seq_id, self.backend.logit_row(row).copy()))
        return sampled(self, job, choice, token, row)

    monkeypatch.setattr(Generating, "_on_sampled", spy)
    return rows


@pytest.fixture
def fresh_engine(model_path: Path, projector: Path) -> Iterator[Engine]:
    """An engine of its own with the session's projector, its cache empty: bits can be
    compared with llama.cpp's fresh context (the cache layout is the same). No n-gram
    drafts: their lengths follow measured step times, and with flash attention (on by
    default on the CPU) a verify decode's rows differ from one-token decodes' enough to turn
    a near-tie, so a repeated greedy answer could differ from the first (4 of 5 runs)."""
    engine = Engine(dataclasses.replace(vision_config(model_path, projector), draft_max=0))
    engine.start()
    assert engine.wait_loaded(120), engine.load_error
    yield engine
    engine.close()


async def run(engine: Engine, request: GenerationRequest) -> tuple[str, Finished]:
    text, finished, _ = await collect(engine, request)
    return text, finished


def tail_start(ids: list[int | None]) -> int:
    """Where the text after the last media position starts."""
    return len(ids) - ids[::-1].index(None)


def greedy(prompt, max_tokens: int = 2) -> GenerationRequest:  # type: ignore[no-untyped-def]
    return GenerationRequest(prompt, SamplingParams(max_tokens=max_tokens, temperature=0))


def reference(model_path: Path, projector: Path, engine: Engine, prompt, images):  # type: ignore[no-untyped-def]
    return llama_cpp_logits(
        model_path,
        projector,
        engine.backend.render(prompt),
        images,
        n_ctx=N_CTX,
        n_seq=PARALLEL,
        n_batch=engine.config.n_batch,
        n_threads=physical_cores(),
    )


async def test_image_logits_equal_llama_cpps_cold_cached_and_on_another_sequence(
    fresh_engine: Engine, model_path: Path, projector: Path, first_rows
) -> None:
    vision_engine = fresh_engine  # its cache empty, laid out as llama.cpp's fresh context
    image = image_bytes(11)
    prompt = chat(image_turn("Cold look: what is in ", image, "? One word."))
    ids, expected = reference(model_path, projector, vision_engine, prompt, [image])
    assert ids.count(None) == IMAGE_TOKENS

    cold = greedy(prompt)
    _, finished = await run(vision_engine, cold)
    first_seq, cold_row = first_rows[id(cold)]
    assert finished.cached_tokens == 0
    assert np.array_equal(cold_row, expected)

    again = greedy(prompt)
    _, finished = await run(vision_engine, again)
    # the image came from the prefix cache; the question after it is decoded again, whole
    assert finished.cached_tokens == tail_start(ids)
    assert np.array_equal(first_rows[id(again)][1], expected)

    other = chat(image_turn("Cold look: what is in ", image_bytes(12), "? One word."))
    _, other_expected = reference(model_path, projector, vision_engine, other, [image_bytes(12)])
    request = greedy(other)
    _, finished = await run(vision_engine, request)
    row = first_rows[id(request)][1]
    assert int(row.argmax()) == int(other_expected.argmax())
    assert not np.allclose(row, expected, atol=1.0)  # another image is never served from the cache
    assert finished.cached_tokens == ids.index(None)  # the text before the image, no more

    # A long request on the first sequence (its prompt is that one's cached prompt) keeps
    # it busy: the same image in a new conversation lands on another sequence. llama.cpp's
    # own logits for a sequence depend on where its cells sit among other sequences' in the
    # unified cache (its fresh-context run of a text prompt differs by up to 0.8 with 5 cells
    # of another sequence in front), so there the answer is compared, not the bits.
    hold = GenerationRequest(prompt, SamplingParams(max_tokens=200, logit_bias=NO_END))
    holding = asyncio.ensure_future(run(vision_engine, hold))
    while id(hold) not in first_rows:
        await asyncio.sleep(0.01)
    assert first_rows[id(hold)][0] == first_seq
    moved = chat(image_turn("Elsewhere: what is in ", image, "? One word."))
    _, moved_expected = reference(model_path, projector, vision_engine, moved, [image])
    request = greedy(moved)
    await run(vision_engine, request)
    holding.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await holding
    seq, row = first_rows[id(request)]
    assert seq != first_seq
    assert int(row.argmax()) == int(moved_expected.argmax())


async def test_audio_logits_equal_llama_cpps_and_a_repeated_clip_comes_from_the_cache(
    fresh_engine: Engine, model_path: Path, projector: Path, first_rows
) -> None:
    vision_engine = fresh_engine
    clip = wav_bytes(1.0, hertz=523.0)
    prompt = chat(
        ChatTurn("user", f"Hear this: {MEDIA_MARKER} What sound is it?", (Media("audio", clip),))
    )
    ids, expected = reference(model_path, projector, vision_engine, prompt, [clip])
    positions = ids.count(None)
    assert positions > 100  # a 30 s chunk's frames, halved by the encoder
    request = greedy(prompt)
    _, finished = await run(vision_engine, request)
    assert finished.cached_tokens == 0
    assert np.array_equal(first_rows[id(request)][1], expected)
    again = greedy(prompt)
    _, finished = await run(vision_engine, again)
    assert finished.cached_tokens == tail_start(ids)
    assert np.array_equal(first_rows[id(again)][1], expected)
    other = chat(
        ChatTurn(
            "user",
            f"Hear this: {MEDIA_MARKER} What sound is it?",
            (Media("audio", wav_bytes(1.0, hertz=262.0)),),
        )
    )
    request = greedy(other)
    _, finished = await run(vision_engine, request)
    assert finished.cached_tokens == ids.index(None)  # the text before the clip, no more
    assert not np.allclose(first_rows[id(request)][1], expected, atol=1.0)


async def test_image_answers_beside_text_streams_equal_their_solo_runs(
    vision_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = [image_bytes(21), image_bytes(23, size=(20, 90), fmt="JPEG")]
    # Prompts without near-ties: llama.cpp's row values in another batch may tip a greedy
    # choice either way, text-only too ("Count from one to ten in words." answers "The model
    # that" alone and "The model of" beside three other text streams).
    pictures = [
        chat(image_turn("Picture A: ", images[0], " Now count from one to ten in words.")),
        chat(image_turn("Picture B: ", images[1], " Now list the days of the week.")),
    ]
    texts = [
        chat(ChatTurn("user", "Name three colours.")),
        chat(ChatTurn("user", "List the days of the week.")),
    ]
    solo = [await run(vision_engine, greedy(p, 3)) for p in pictures]
    # Which requests each decode sampled a token for, by decode.
    decodes = itertools.count()
    step = [-1]
    sampled: dict[int, set[int]] = {}
    decode, on_sampled = vision_engine.backend.decode, Generating._on_sampled

    def counted_decode() -> int:
        step[0] = next(decodes)
        return decode()

    def spy(self, job, choice, token, row):  # type: ignore[no-untyped-def]
        sampled.setdefault(step[0], set()).add(id(job.request))
        return on_sampled(self, job, choice, token, row)

    monkeypatch.setattr(vision_engine.backend, "decode", counted_decode)
    monkeypatch.setattr(Generating, "_on_sampled", spy)
    # Text streams that outlast the pictures' answers (no end of generation; cancelled after
    # them), then the pictures once the streams are generating.
    params = SamplingParams(max_tokens=STREAM_TOKENS, temperature=0, logit_bias=NO_END)
    streams = [GenerationRequest(p, params) for p in texts]
    streaming = [asyncio.ensure_future(run(vision_engine, r)) for r in streams]
    while not any({id(r) for r in streams} & ids for ids in sampled.values()):
        await asyncio.sleep(0.005)
    requests = [greedy(p, 3) for p in pictures]
    together = await asyncio.gather(*(run(vision_engine, r) for r in requests))
    for task in streaming:
        task.cancel()
    await asyncio.gather(*streaming, return_exceptions=True)
    await assert_engine_idle(vision_engine)
    assert [text for text, _ in together] == [text for text, _ in solo]
    # every token of each picture's answer was sampled in a decode that held a text stream
    stream_ids = {id(r) for r in streams}
    for request in requests:
        steps = [ids for ids in sampled.values() if id(request) in ids]
        assert steps and all(ids & stream_ids for ids in steps), sampled


async def test_n_choices_share_the_image_prefix(fresh_engine: Engine) -> None:
    # One prompt (an image in it) for three greedy choices: decoded once, copied to the
    # others, its cells counted once; every choice gives the lone answer.
    prompt = chat(image_turn("Three answers about ", image_bytes(71), ": name a colour."))
    alone, _ = await run(fresh_engine, greedy(prompt, 4))
    request = GenerationRequest(prompt, SamplingParams(max_tokens=4, temperature=0), n=3)
    texts: dict[int, str] = {}
    ends: list[Finished] = []
    steps = fresh_engine.steps
    async with EngineClient(fresh_engine).generate(request) as generation:
        info = await generation.submit()
        async for event in generation.events():
            if isinstance(event, TextDelta):
                texts[event.index] = texts.get(event.index, "") + event.text
            elif isinstance(event, Finished):
                ends.append(event)
    assert texts == dict.fromkeys(range(3), alone)
    tail = len(prompt.messages[0].content.split(MEDIA_MARKER)[1])  # characters, >= tokens
    assert all(info.prompt_tokens - tail <= end.cached_tokens for end in ends)
    assert fresh_engine.steps - steps <= 4  # the question after the image, then 3 tokens
    await assert_engine_idle(fresh_engine)
    generated = sum(end.completion_tokens - 1 for end in ends)  # each last token is undecoded
    assert fresh_engine.stats().kv_cells_used == info.prompt_tokens + generated


async def test_two_images_across_messages_equal_llama_cpps_and_a_repeat_comes_from_the_cache(
    fresh_engine: Engine, model_path: Path, projector: Path, first_rows
) -> None:
    a, b = image_bytes(31), image_bytes(32)
    first = chat(
        image_turn("Two pictures: ", a, " and "),
        ChatTurn("assistant", "I see them."),
        image_turn("and this ", b, " one. Compare."),
    )
    ids, expected = reference(model_path, projector, fresh_engine, first, [a, b])
    assert ids.count(None) == 2 * IMAGE_TOKENS
    cold = greedy(first, 6)
    text, finished = await run(fresh_engine, cold)
    assert finished.completion_tokens > 0 and text
    assert finished.cached_tokens == 0
    assert np.array_equal(first_rows[id(cold)][1], expected)
    # The same conversation again: both images come from the prefix cache, up to the text
    # after the second, which is decoded again; the logits are llama.cpp's still.
    again = greedy(first, 6)
    repeated, finished = await run(fresh_engine, again)
    assert repeated == text
    assert finished.cached_tokens == tail_start(ids)
    assert np.array_equal(first_rows[id(again)][1], expected)
    swapped = chat(
        image_turn("Two pictures: ", b, " and "),
        ChatTurn("assistant", "I see them."),
        image_turn("and this ", a, " one. Compare."),
    )
    _, finished = await run(fresh_engine, greedy(swapped, 6))
    # the first image differs: the text before it comes from the cache, nothing after it
    assert finished.cached_tokens == ids.index(None)


async def test_bad_images_are_refused_and_the_engine_goes_on(vision_engine: Engine) -> None:
    good = image_bytes(41)
    cases = {
        "garbage": b"this is not an image at all",
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "bomb": _bomb_png(),
    }
    messages = {}
    for name, data in cases.items():
        with pytest.raises(InvalidMedia) as caught:
            await run(vision_engine, greedy(chat(image_turn("Bad: ", data, " ?"))))
        messages[name] = str(caught.value)
        assert messages[name].startswith("media item 0 (image): "), name
    assert "20000x20000 pixels, more than the limit" in messages["bomb"]
    too_many = chat(
        ChatTurn(
            "user",
            f"Two clips: {MEDIA_MARKER} and {MEDIA_MARKER}",
            (Media("audio", wav_bytes(1.0)), Media("audio", wav_bytes(1.0, hertz=330.0))),
        )
    )
    with pytest.raises(RequestTooLarge):
        await run(vision_engine, greedy(too_many))
    text, _ = await run(vision_engine, greedy(chat(image_turn("Fine: ", good, " ?")), 4))
    assert text
    await assert_engine_idle(vision_engine)


def _bomb_png() -> bytes:
    """A 20000×20000 PNG of a few KB: refused from its header, never decoded."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("1", (20000, 20000)).save(out, "PNG")
    return out.getvalue()


async def test_a_cancel_during_image_encode_or_decode_leaves_the_engine_idle(
    vision_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = vision_engine.backend
    slow_encode, slow_decode = backend.encode_media, backend.decode_media
    stage: dict[str, float] = {}

    def encode(*args):  # type: ignore[no-untyped-def]
        stage["encode"] = time.monotonic()
        time.sleep(0.5)
        return slow_encode(*args)

    def decode(*args):  # type: ignore[no-untyped-def]
        stage["decode"] = time.monotonic()
        time.sleep(0.5)
        return slow_decode(*args)

    monkeypatch.setattr(backend, "encode_media", encode)
    monkeypatch.setattr(backend, "decode_media", decode)
    for wanted in ("encode", "decode"):
        stage.clear()
        steps = vision_engine.steps
        prompt = chat(image_turn(f"Leave during {wanted}: ", image_bytes(60), " ?"))
        task = asyncio.ensure_future(run(vision_engine, greedy(prompt, 50)))
        while wanted not in stage:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await assert_engine_idle(vision_engine)
        stats = vision_engine.stats()
        assert stats.busy_slots == 0 and stats.queue_length == 0
        # nothing was generated for it: at most the media step and one more ran
        assert vision_engine.steps - steps <= 3


def test_a_projector_for_another_width_or_no_projector_file_fails_the_load(
    model_path: Path, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong-width.gguf"
    write_tiny_projector(wrong, width=320)
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"GGUF? no")
    for path, why in ((wrong, "embeddings are 640 wide"), (not_gguf, "could not load")):
        engine = Engine(EngineConfig(model_path=str(model_path), mmproj_path=str(path)))
        assert not engine.load()
        assert why in str(engine.load_error)
        assert "\n" not in str(engine.load_error)
