"""A long context's KV cache holds the memory of its cells in use (pages.release_cleared), on
the real model, measured as the process's resident anonymous memory (RssAnon) beside an
engine whose cache stays resident, as llama.cpp leaves it: after a 32k context is made, the
process holds almost none of its full-attention cache; the pages of the cells a prompt fills
come back; and the answers are the same."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
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
# What ~800 cells' pages bring back at least: their K and V rows in all 18 layers (18 KiB a
# cell, ~14 MiB). With flash attention (the default on this build) V rows lie end to end like
# K's, so that is about all the prompt touches (measured 15.4 MiB); without it V is stored by
# column, a page per 2048 cells of each of its 256 rows, and the window layers' whole caches
# fill (22 MiB).
FILLED_BYTES = 12 * 2**20


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


async def measure(model_path: Path) -> Held:
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


def run_engine(model_path: Path, *, resident: bool = False) -> Held:
    """`measure` in a fresh interpreter (after other tests, glibc may serve the KV buffers
    from a heap it has grown, where nothing is handed back); with `resident`, the cache stays
    resident, as llama.cpp leaves it."""
    done = subprocess.run(
        [sys.executable, "-m", __name__, str(model_path), "resident" if resident else "released"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Held(**json.loads(done.stdout.splitlines()[-1]))


def test_a_long_context_holds_the_memory_of_its_cells_in_use(model_path):
    lazy = run_engine(model_path)
    eager = run_engine(model_path, resident=True)
    mib = {"lazy": (lazy.made >> 20, lazy.after_prompt >> 20)}
    mib["eager"] = (eager.made >> 20, eager.after_prompt >> 20)
    # the full-attention layers' 32k cells are not held once the context is made ...
    assert eager.made - lazy.made >= 0.9 * FULL_KV_BYTES, mib
    # ... the pages of the cells the prompt wrote come back, and only those
    assert (lazy.after_prompt - lazy.made) - (eager.after_prompt - eager.made) >= FILLED_BYTES, mib
    assert eager.after_prompt - lazy.after_prompt >= 0.85 * FULL_KV_BYTES, mib
    assert lazy.answer == eager.answer and lazy.answer


if __name__ == "__main__":
    model, mode = sys.argv[1:]
    if mode == "resident":
        pages.release_cleared = lambda before, sizes: []
    print(json.dumps(asdict(asyncio.run(measure(Path(model))))))
