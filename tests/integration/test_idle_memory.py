"""What an idle engine hands back to the system besides its logit rows (test_speculation.py):
the pages of its compute buffer, which llama.cpp keeps for the largest step it ran (those of
the steps timed at load at once), and the free pages of the C heap, which glibc keeps in each
thread's malloc arena until it is trimmed, measured as resident pages and as the process's
resident anonymous memory (README "Memory"); and the answers after the compute buffer went
back are the same."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tests.integration.engine_idle import assert_engine_idle
from tests.integration.test_kv_memory import anon_rss
from tests.integration.test_window_checkpoints import started_engine

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's heap is trimmed on Linux only"
)

CHAT = "/v1/chat/completions"
PASSAGE = (
    "The lighthouse at the end of the harbour was built in 1852 from granite quarried on the "
    "island. Its lamp burned whale oil until 1890, then paraffin, and since 1954 it has been "
    "electric."
)
FREED = 32 * 2**20
BLOCK = 8192  # a malloc of its own (Python's allocator takes 512 bytes at most)


def leave_free_blocks(total: int) -> list[bytes]:
    """Allocate `total` bytes of BLOCK-sized objects on the calling thread and free all but
    one in 64, as a large request's parsing leaves its thread's arena: free memory between
    live blocks, which glibc neither unmaps nor trims from the top. Returns the survivors."""
    blocks = [bytes(BLOCK) for _ in range(total // BLOCK)]
    return blocks[::64]


async def test_an_idle_engine_trims_what_a_request_left_in_the_heaps(client, engine, monkeypatch):
    from edgeserve.engine import worker

    monkeypatch.setattr(worker, "COMPUTE_PAGES_IDLE_S", 3600.0)
    resp = await client.post(
        CHAT,
        json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert resp.status == 200
    await assert_engine_idle(engine)
    survivors = await asyncio.to_thread(leave_free_blocks, FREED)
    before = anon_rss()
    monkeypatch.setattr(worker, "COMPUTE_PAGES_IDLE_S", 0.0)
    engine.housekeeping()  # what the engine thread does COMPUTE_PAGES_IDLE_S after its last step
    assert not engine.backend.holds_compute_pages
    assert anon_rss() < before - FREED * 3 // 4, "the freed blocks' pages went back"
    assert len(survivors) == FREED // BLOCK // 64


async def test_an_idle_engine_hands_its_compute_buffer_back_and_answers_the_same(
    client, engine, monkeypatch
):
    # A copy task drafts: its steps carry a logit row per drafted token, a MiB each in the
    # compute buffer as in the output rows.
    from edgeserve.engine import worker

    monkeypatch.setattr(worker, "COMPUTE_PAGES_IDLE_S", 3600.0)
    content = f"{PASSAGE}\n\nCopy the passage above exactly, word for word."
    request = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 40,
        "temperature": 0,
    }
    before = await (await client.post(CHAT, json=request)).json()
    await assert_engine_idle(engine)
    scratch = engine.backend.model.scratch
    assert scratch is not None, "the generation context's compute buffer was found"
    row_pages = 262144 * 4 // 4096
    assert scratch.resident() > 2 * row_pages, "the rows of a drafted step"
    monkeypatch.setattr(worker, "COMPUTE_PAGES_IDLE_S", 0.0)
    engine.housekeeping()
    assert scratch.resident() <= 1
    after = await (await client.post(CHAT, json=request)).json()
    assert after["choices"][0]["message"] == before["choices"][0]["message"]


def test_a_loaded_engine_holds_no_compute_pages_of_the_steps_it_timed(model_path):
    # The steps of up to 16 logit rows timed at load (step_cost.CALIBRATION_ROWS) leave a
    # MiB of logits per row in the compute buffer, which no request asked for.
    engine = started_engine(model_path, n_ctx=4096)
    try:
        scratch = engine.backend.model.scratch
        assert scratch is not None
        assert scratch.resident() <= 1
        assert engine.stats().engine_steps == 0, "no request has stepped"
    finally:
        engine.close()
