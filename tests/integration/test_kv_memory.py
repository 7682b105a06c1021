"""A long context's KV cache holds the memory of its cells in use (pages.release_cleared), on
the real model, measured as the process's resident anonymous memory (RssAnon) beside an
engine whose cache stays resident, as llama.cpp leaves it: after a 32k context is made, the
process holds almost none of its full-attention cache; the pages of the cells a prompt fills
come back; and the answers are the same."""

from __future__ import annotations

import sys
from dataclasses import dataclass
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
# What ~800 cells' pages bring back at least: the sliding-window layers' caches (1536 cells,
# 22 MiB) fill, the full-attention layers' first ~1k cells too (K rows lie end to end, V is
# stored by column: a page per 2048 cells of each of its 256 rows, 3 MiB).
FILLED_BYTES = 16 * 2**20


def anon_rss() -> int:
    """This process's resident anonymous memory, in bytes (RssAnon)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@dataclass(frozen=True)
class Held:
    """What an engine added to the process's RssAnon: once made, and after the prompt."""

    made: int
    after_prompt: int
    answer: str


async def run_engine(model_path: Path) -> Held:
    """Make the 32k engine (one row a step, no drafts: the same batches in every engine),
    answer PROMPT, and close it; what it added to RssAnon on the way."""
    before = anon_rss()
    engine: Engine = started_engine(model_path, n_ctx=N_CTX, draft_max=0)
    try:
        made = anon_rss() - before
        answer, _ = await greedy(engine, PROMPT, max_tokens=16)
        return Held(made, anon_rss() - before, answer)
    finally:
        engine.close()


async def test_a_long_context_holds_the_memory_of_its_cells_in_use(model_path, monkeypatch):
    lazy = await run_engine(model_path)
    with monkeypatch.context() as patch:
        patch.setattr(pages, "release_cleared", lambda before, sizes: [])
        eager = await run_engine(model_path)
    mib = {"lazy": (lazy.made >> 20, lazy.after_prompt >> 20)}
    mib["eager"] = (eager.made >> 20, eager.after_prompt >> 20)
    # the full-attention layers' 32k cells are not held once the context is made ...
    assert eager.made - lazy.made >= 0.9 * FULL_KV_BYTES, mib
    # ... the pages of the cells the prompt wrote come back, and only those
    assert (lazy.after_prompt - lazy.made) - (eager.after_prompt - eager.made) >= FILLED_BYTES, mib
    assert eager.after_prompt - lazy.after_prompt >= 0.85 * FULL_KV_BYTES, mib
    assert lazy.answer == eager.answer and lazy.answer
