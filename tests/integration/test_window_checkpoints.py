"""Gemma 3's sliding-window layers keep window-sized caches (llama.cpp without `swa_full`), and a
cached prefix whose window is gone is reused from a checkpoint (checkpoints.py), on the real
model: the answers equal those of full-size caches, cold."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as lc
import pytest

from edgeserve.config import physical_cores
from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import (
    EngineConfig,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
)
from edgeserve.engine.worker import Engine
from tests.integration.engine_idle import assert_engine_idle

N_CTX = 8192  # one sequence: the sliding layers hold 768 cells (512 + a 256 micro-batch)
WINDOW = 512  # Gemma 3's
COLOURS = ("red", "green", "blue", "amber")


def inventory(first: int, count: int, verb: str = "checked") -> str:
    """Lines of a long document, ~19 tokens each; `verb` changes every line."""
    return " ".join(
        f"Item {i}: the {COLOURS[i % 4]} lamp in room {i * 7 % 31} was {verb} on day {i % 28 + 1}."
        for i in range(first, first + count)
    )


LONG = inventory(0, 130) + "\nWhich lamp was in room 3?"  # ~2500 tokens: past the window cache
# Shares LONG's first ~1100 tokens, then differs: the window of its first new position (from
# ~590) is long gone from LONG's sequence, whose sliding layers kept less than 768 positions.
BRANCH = inventory(0, 58) + " " + inventory(58, 40, "repaired") + "\nWhich lamp was blue?"


def started_engine(model_path: Path, **config: Any) -> Engine:
    """A loaded engine of one sequence on the default model, with `config` on top."""
    config = {"parallel": 1, "n_threads": physical_cores(), **config}
    engine = Engine(EngineConfig(model_path=str(model_path), **config))
    engine.start()
    if not engine.wait_loaded(120):
        raise RuntimeError(f"the default model failed to load: {engine.load_error}")
    return engine


def _engine(model_path: Path, *, swa_full: bool) -> Engine:
    return started_engine(model_path, n_ctx=N_CTX, swa_full=swa_full)


@pytest.fixture(scope="module")
def window_engine(model_path: Path) -> Iterator[Engine]:
    engine = _engine(model_path, swa_full=False)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def full_engine(model_path: Path) -> Iterator[Engine]:
    engine = _engine(model_path, swa_full=True)
    yield engine
    engine.close()


def line_mark(engine: Engine, prompt: str) -> int:
    """Where the checkpoint of a raw `prompt`'s last line goes: where that line starts among
    its tokens (checked to be where the tokens of that line, tokenized alone, begin), moved
    back to a multiple of the backend's row_multiple (prepare.py)."""
    backend = engine.backend
    tokens = backend.tokenize(prompt, add_special=True, parse_special=False)
    line = backend.tokenize(prompt.rpartition("\n")[2], add_special=False, parse_special=False)
    assert tokens[-len(line) :] == line
    start = len(tokens) - len(line)
    return start - start % backend.row_multiple


async def greedy(engine: Engine, prompt: str, max_tokens: int = 8) -> tuple[str, int]:
    """The greedy answer and how many prompt tokens came from the cache."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    async with EngineClient(engine).generate(GenerationRequest(prompt, params)) as generation:
        await generation.submit()
        events = [event async for event in generation.events()]
    await assert_engine_idle(engine)
    (finished,) = (event for event in events if isinstance(event, Finished))
    return "".join(e.text for e in events if isinstance(e, TextDelta)), finished.cached_tokens


async def test_the_sliding_layers_hold_a_window_unless_swa_full(window_engine, full_engine):
    for engine in (window_engine, full_engine):
        await greedy(engine, LONG)
    window_first, last = window_engine.backend.seq_pos_range(0)
    assert WINDOW < window_first <= last + 1 - WINDOW + 1  # the window of its next position
    assert full_engine.backend.seq_pos_range(0)[0] == 0
    assert window_engine.scheduler.windows.spacing == WINDOW
    assert full_engine.scheduler.windows.spacing == 0  # no checkpoints with full-size caches


@pytest.mark.parametrize("parallel", [1, 3])
async def test_a_checkpoint_holds_one_window_and_the_caches_no_spare_sequence(
    model_path: Path, window_engine, parallel: int
):
    # The sliding caches hold a window per sequence and a micro-batch (llama.cpp sizes them
    # by the sequences: a spare one would make them a window larger), and a sequence's
    # cells there reach further back than its window until they are reused; a checkpoint
    # copies only the window, whatever else the cache still holds.
    engine = window_engine
    if parallel > 1:
        engine = started_engine(model_path, n_ctx=N_CTX, parallel=parallel)
    try:
        await greedy(engine, LONG)
        sequences = lc.llama_n_seq_max(engine.backend.model.ctx)
        micro_batch = lc.llama_n_ubatch(engine.backend.model.ctx)
        first, last = engine.backend.seq_pos_range(0)
        kept = {c.position: c for c in engine.scheduler.windows}
    finally:
        if engine is not window_engine:
            engine.close()
    assert sequences == parallel
    assert micro_batch == 256  # WINDOWED_UBATCH: a CPU context with window-sized caches
    assert last + 1 - first == parallel * WINDOW + micro_batch  # the whole cache
    whole = memoryview(kept[WINDOW].state).nbytes  # positions 0 ... WINDOW-1: one window
    assert len(kept) > 2 and all(memoryview(c.state).nbytes == whole for c in kept.values())
    assert all(c.cells == WINDOW for c in kept.values())


async def test_a_prefix_whose_window_is_gone_comes_from_a_checkpoint_and_answers_the_same(
    window_engine, full_engine
):
    await greedy(window_engine, LONG)
    branch, cached = await greedy(window_engine, BRANCH)
    assert cached == 2 * WINDOW  # the checkpoint before position 1024, not the whole ~1100
    await greedy(full_engine, LONG)
    full, full_cached = await greedy(full_engine, BRANCH)
    assert full_cached > cached  # full-size caches keep every position of the shared part
    await greedy(full_engine, "Something else entirely.")  # evicts the cache: BRANCH cold
    cold, cold_cached = await greedy(full_engine, BRANCH)
    assert cold_cached <= 1
    assert branch == full == cold


async def test_another_question_after_the_same_stored_document_goes_on_from_its_line(
    model_path: Path, full_engine
):
    # LONG is asked, then its cells go to another prompt (LONG moves to the memory tier, its
    # sliding layers holding only its last window). LONG with another question on its last
    # line comes back from the checkpoint where that line starts: every position of the
    # document, not only those before the last multiple of the window.
    other = inventory(0, 130) + "\nWhich lamp was blue?"
    engine = started_engine(model_path, n_ctx=N_CTX, prompt_cache_ram=1 << 30)
    try:
        start = line_mark(engine, other)
        assert start % WINDOW > 64  # well past the last multiple of the window
        await greedy(engine, LONG)
        await greedy(engine, "Something else entirely.")
        answer, cached = await greedy(engine, other)
    finally:
        engine.close()
    assert cached == start
    assert answer == (await greedy(full_engine, other))[0]
