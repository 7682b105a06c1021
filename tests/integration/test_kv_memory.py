"""A long context's KV cache holds the memory of its cells in use (pages.release_cleared), on
the real model: after a 32k context is made, almost none of its KV cache is resident; the pages
of the cells a prompt fills come back; and the answers equal those of a context whose cache
stays resident, as llama.cpp leaves it."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest

from edgeserve.engine.llama import pages
from edgeserve.engine.worker import Engine
from tests.integration.test_window_checkpoints import greedy, inventory, started_engine

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the KV cache is handed back on Linux only"
)

N_CTX = 32768
# Gemma 3 270M: 3 of its 18 layers attend to the whole context, K and V 256 halves a cell each.
FULL_KV_BYTES = 3 * N_CTX * 2 * 256 * 2
PROMPT = inventory(0, 40) + "\nWhich lamp was in room 3?"  # ~800 tokens


def _engine(model_path: Path) -> Engine:
    # One row a step (no drafts): the same batches in both engines.
    return started_engine(model_path, n_ctx=N_CTX, draft_max=0)


def resident_bytes(kv_pages: list[tuple[int, int]]) -> int:
    return sum(pages.resident(address, size) for address, size in kv_pages) * mmap.PAGESIZE


async def test_a_long_context_holds_the_memory_of_its_cells_in_use(model_path, monkeypatch):
    engine = _engine(model_path)
    try:
        kv_pages = engine.backend.model.kv_pages
        held = sum(size for _, size in kv_pages)
        assert held >= FULL_KV_BYTES, "the full-attention layers' 32k cells, handed back"
        assert resident_bytes(kv_pages) < held // 100
        lazy, _ = await greedy(engine, PROMPT, max_tokens=16)
        filled = resident_bytes(kv_pages)
        # ~820 cells: the sliding-window layers' caches (1536 cells, 22 MiB) fill, the
        # full-attention layers' 32k cells (96 MiB) only their first ~1k: K rows lie end to
        # end, V is stored by column (a page per 2048 cells of each of its 256 rows).
        assert filled > 0, "the pages of the cells written come back"
        assert held - filled >= 0.9 * FULL_KV_BYTES, "the cells not in use stay out"
    finally:
        engine.close()
    monkeypatch.setattr(pages, "release_cleared", lambda before, sizes: [])
    engine = _engine(model_path)
    try:
        assert engine.backend.model.kv_pages == []
        eager, _ = await greedy(engine, PROMPT, max_tokens=16)
    finally:
        engine.close()
    assert lazy == eager and lazy
