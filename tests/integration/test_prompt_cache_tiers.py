"""The prompt cache's tiers below the KV cache on the real model (Gemma 3: sliding-window
caches, so a stored sequence holds its last window and its checkpoints): documents whose cells
were given to other prompts come back from host memory, and from the disk tier after the
engine stops and a new one starts; the answers equal a cold engine's, and a disk tier never
restores entries of another context size or a damaged file."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeserve.engine.types import CacheTierStats
from edgeserve.engine.worker import Engine
from tests.integration.test_window_checkpoints import greedy, inventory, started_engine

N_CTX = 2048
# Two documents of ~760 tokens: with one sequence, each takes the cells of the other.
DOCS = (inventory(0, 40), inventory(40, 40, "moved"))
QUESTIONS = ("\nWhich lamp was in room 3?", "\nWhich lamp was blue?")


def tiers(engine: Engine) -> dict[str, CacheTierStats]:
    return {t.tier: t for t in engine.stats().prompt_cache_tiers}


def engine_with(model_path: Path, **config: Any) -> Engine:
    return started_engine(model_path, n_ctx=N_CTX, **config)


@pytest.fixture(scope="module")
def cold_answers(model_path: Path) -> Iterator[dict[str, str]]:
    """Each document with each question, answered by an engine with no tiers, each prompt
    after another one so that nothing of it is cached."""
    engine = engine_with(model_path, prompt_cache_ram=0)
    answers: dict[str, str] = {}
    try:

        async def run() -> None:
            for question in QUESTIONS:
                for doc in DOCS:
                    await greedy(engine, "Something else entirely.")
                    answers[doc + question] = (await greedy(engine, doc + question))[0]

        asyncio.run(run())
    finally:
        engine.close()
    yield answers


async def test_documents_come_back_from_memory_exactly(model_path: Path, cold_answers):
    engine = engine_with(model_path, prompt_cache_ram=64 << 20)
    try:
        for doc in DOCS:
            await greedy(engine, doc + QUESTIONS[0])
        assert tiers(engine)["ram"].entries == 2  # each stored once the engine was idle
        for question in QUESTIONS:
            for doc in DOCS:
                answer, cached = await greedy(engine, doc + question)
                assert answer == cold_answers[doc + question]
                assert cached >= 512  # at least up to the document's checkpoint
        ram = tiers(engine)["ram"]
        assert ram.hits >= 3 and ram.bytes <= 64 << 20
    finally:
        engine.close()


async def test_the_disk_tier_outlives_the_engine_and_keeps_to_its_context(
    model_path: Path, cold_answers, tmp_path: Path, caplog
):
    first = engine_with(model_path, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    try:
        for doc in DOCS:
            await greedy(first, doc + QUESTIONS[0])
    finally:
        first.close()  # stores what the sequence still holds
    files = sorted(tmp_path.glob("*/*.prompt"))
    assert len(files) == 2

    again = engine_with(model_path, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    try:
        assert tiers(again)["disk"].entries == 2
        for doc in DOCS:
            answer, cached = await greedy(again, doc + QUESTIONS[1])
            assert answer == cold_answers[doc + QUESTIONS[1]]
            assert cached >= 512
        assert tiers(again)["disk"].hits == 2
    finally:
        again.close()

    other = engine_with(
        model_path, n_ctx=2 * N_CTX, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path)
    )
    try:
        assert tiers(other)["disk"].entries == 0  # another context size: none of them
        answer, cached = await greedy(other, DOCS[0] + QUESTIONS[1])
        assert answer == cold_answers[DOCS[0] + QUESTIONS[1]] and cached == 0
    finally:
        other.close()

    files = sorted(tmp_path.glob(f"{files[0].parent.name}/*.prompt"))
    for path in files:  # one bit flipped at the end of each entry's KV
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
    damaged = engine_with(model_path, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    try:
        with caplog.at_level(logging.WARNING, logger="edgeserve.engine"):
            answer, cached = await greedy(damaged, DOCS[0] + QUESTIONS[1])
        assert answer == cold_answers[DOCS[0] + QUESTIONS[1]] and cached == 0
        assert "prompt cache: ignoring" in caplog.text
    finally:
        damaged.close()
