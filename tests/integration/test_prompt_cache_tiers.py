"""The prompt cache's tiers below the KV cache on the real model (Gemma 3: sliding-window
caches, so a stored sequence holds its last window and its checkpoints): documents whose cells
were given to other prompts come back from host memory, and from the disk tier after the
engine stops and a new one starts; the answers equal a cold engine's, and a damaged file is
never restored (another context's entries: tests/unit/test_prompt_store_fake_backend.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeserve.engine.types import CacheTierStats
from edgeserve.engine.worker import Engine
from tests.integration.test_window_checkpoints import (
    greedy,
    inventory,
    line_mark,
    started_engine,
)

# With one sequence, room for 5 window checkpoints (the cells window-sized caches save).
N_CTX = 4096
# Two documents of ~570 tokens, past Gemma's 512-position window: with one sequence, each
# takes the cells of the other.
DOCS = (inventory(0, 29), inventory(29, 29, "moved"))
SAME, OTHER = "\nWhich lamp was in room 3?", "\nWhich lamp was blue?"


def tiers(engine: Engine) -> dict[str, CacheTierStats]:
    return {t.tier: t for t in engine.stats().prompt_cache_tiers}


def engine_with(model_path: Path, **config: Any) -> Engine:
    return started_engine(model_path, **{"n_ctx": N_CTX, **config})


@pytest.fixture(scope="module")
def cold(model_path: Path) -> Iterator[dict[str, str]]:
    """Greedy answers to each document with the OTHER question, from an engine without
    tiers that saw nothing before (its two prompts share no more than the template)."""
    engine = engine_with(model_path, prompt_cache_ram=0)
    answers: dict[str, str] = {}

    async def fill() -> None:
        for doc in DOCS:
            answers[doc + OTHER], cached = await greedy(engine, doc + OTHER)
            assert cached < 8

    try:
        asyncio.run(fill())
    finally:
        engine.close()
    yield answers


async def test_documents_come_back_from_memory_exactly(model_path: Path, cold):
    engine = engine_with(model_path, prompt_cache_ram=256 << 20)  # ~20 MiB an entry
    try:
        first = [await greedy(engine, doc + SAME) for doc in DOCS]
        # The first, copied when the second took its cells; the second, whose cells the KV
        # cache still holds, not at all.
        assert tiers(engine)["ram"].entries == 1
        for doc, (answer, _) in zip(DOCS, first, strict=True):
            again, cached = await greedy(engine, doc + SAME)
            assert again == answer and cached > 512  # all but the last token
        answer, cached = await greedy(engine, DOCS[0] + OTHER)
        assert answer == cold[DOCS[0] + OTHER]
        # The entry's window checkpoint where the question's line starts (past the one at 512)
        assert cached == line_mark(engine, DOCS[0] + OTHER) > 512
        ram = tiers(engine)["ram"]
        assert ram.hits == 3 and ram.bytes <= 256 << 20
    finally:
        engine.close()


async def test_idle_sequences_wait_in_memory_while_another_generates(model_path: Path, cold):
    # Two sequences hold a document each; the next prompt reuses the first's in place, and
    # the second's cells (which every decode of it would attend over, masked) go to memory.
    engine = engine_with(model_path, parallel=2, prompt_cache_ram=256 << 20)
    try:
        first = await asyncio.gather(*(greedy(engine, doc + SAME) for doc in DOCS))
        assert all(engine.backend.seq_pos_range(seq)[1] >= 0 for seq in range(2))
        answer, cached = await greedy(engine, DOCS[0] + OTHER)
        assert answer == cold[DOCS[0] + OTHER] and cached >= 512  # in place
        assert sum(engine.backend.seq_pos_range(seq)[1] >= 0 for seq in range(2)) == 1
        assert tiers(engine)["ram"].entries == 1
        again, cached = await greedy(engine, DOCS[1] + SAME)
        # From memory: the entry kept its last window (its answer's tokens included), so the
        # prompt goes on from its checkpoint.
        assert again == first[1][0] and cached >= 512
        assert tiers(engine)["ram"].hits == 1
    finally:
        engine.close()
    # Without the memory tier they keep their cells (on the fake backend:
    # tests/unit/test_prompt_store_fake_backend.py).


async def test_the_disk_tier_outlives_the_engine_and_ignores_a_damaged_entry(
    model_path: Path, cold, tmp_path: Path, caplog
):
    first = engine_with(model_path, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    try:
        for doc in DOCS:
            await greedy(first, doc + SAME)
    finally:
        first.close()
    (folder,) = tmp_path.iterdir()
    assert len(list(folder.glob("*.prompt"))) == 2

    again = engine_with(model_path, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    try:
        assert tiers(again)["disk"].entries == 2
        for doc in DOCS:
            answer, cached = await greedy(again, doc + OTHER)
            assert answer == cold[doc + OTHER] and cached == line_mark(again, doc + OTHER)
        assert tiers(again)["disk"].hits == 2
    finally:
        again.close()

    for path in folder.glob("*.prompt"):  # one bit flipped at the end of each entry
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
    damaged = engine_with(model_path, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    try:
        with caplog.at_level(logging.WARNING, logger="edgeserve.engine"):
            answer, cached = await greedy(damaged, DOCS[0] + OTHER)
        assert answer == cold[DOCS[0] + OTHER] and cached == 0
        assert "prompt cache: ignoring" in caplog.text and "checksum mismatch" in caplog.text
    finally:
        damaged.close()
