"""N-gram speculation on the real model: a greedy copy task drafts from its prompt and keeps
most drafts (at the default sampling, temperature 1, the small model wanders and keeps few);
/metrics and the access log count them; a client
that leaves mid-answer leaves the engine idle with only verified cells in the KV cache.
(That answers are the ones of one token per step is checked exactly on FakeBackend, whose
logits do not depend on the batch: tests/unit/test_speculation_fake_backend.py.)"""

from __future__ import annotations

import asyncio
import logging

import pytest

from edgeserve.engine.step_cost import CALIBRATION_ROWS
from tests.integration.conftest import EOS_BAN
from tests.integration.engine_idle import assert_engine_idle, assert_left_work_stops

CHAT = "/v1/chat/completions"
PASSAGE = (
    "The lighthouse at the end of the harbour was built in 1852 from granite quarried on the "
    "island. Its lamp burned whale oil until 1890, then paraffin, and since 1954 it has been "
    "electric. Three keepers lived there in turns, and the last of them left in 1987."
)
COPY = f"{PASSAGE}\n\nCopy the passage above exactly, word for word."


def body(**extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": COPY}], **extra}


def drafts(engine) -> tuple[int, int]:
    stats = engine.stats()
    return stats.draft_tokens, stats.draft_accepted_tokens


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {}], ids=["greedy", "default"])
async def test_a_copy_task_keeps_most_of_its_drafts(client, engine, sampling, caplog):
    drafted, accepted = drafts(engine)
    caplog.set_level(logging.INFO, logger="edgeserve.access")
    resp = await client.post(CHAT, json=body(max_tokens=40, **sampling))
    assert resp.status == 200
    answer = (await resp.json())["choices"][0]["message"]["content"]
    new_drafted, new_accepted = drafts(engine)
    drafted, accepted = new_drafted - drafted, new_accepted - accepted
    if sampling:  # greedy: the answer copies the passage, and the drafts are kept
        assert answer.startswith(PASSAGE[:40])
        assert drafted > 0 and accepted >= drafted / 2, (accepted, drafted, answer)
    assert accepted <= drafted
    [line] = [r for r in caplog.records if r.name == "edgeserve.access"]
    # the access line names drafts only when there were some (a sampled answer may draft none)
    logged = (getattr(line, "draft_tokens", 0), getattr(line, "draft_accepted", 0))
    assert logged == (drafted, accepted)
    await assert_engine_idle(engine)


async def test_metrics_count_drafted_and_kept_tokens(client, engine):
    await client.post(CHAT, json=body(max_tokens=24, temperature=0))
    text = await (await client.get("/metrics")).text()
    samples = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("edgeserve_draft")
    )
    drafted, accepted = drafts(engine)
    assert float(samples["edgeserve_draft_tokens_total"]) == drafted > 0
    assert float(samples["edgeserve_draft_accepted_tokens_total"]) == accepted > 0
    # Drafts of different lengths have shown what a logit row costs on this machine.
    costs = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("edgeserve_step_")
    )
    assert 0 < float(costs["edgeserve_step_row_seconds"]) < 5


async def leave_while_drafting(resp, engine) -> None:
    """Read the stream `resp` until the engine has drafted for it, then go away; the
    generation must stop at once (its max_tokens far away, EOS banned)."""
    drafted, _ = drafts(engine)
    for _ in range(200):
        await resp.content.readuntil(b"\n\n")
        if drafts(engine)[0] > drafted:
            break
    assert drafts(engine)[0] > drafted, "drafts were made before the client left"
    left_at = engine.stats().engine_steps
    resp.close()
    await assert_left_work_stops(engine, left_at)


async def test_disconnect_while_drafting_leaves_only_verified_cells(client, engine):
    request = body(max_tokens=1000, temperature=0, logit_bias=EOS_BAN, stream=True)
    resp = await client.post(CHAT, json=request)
    await leave_while_drafting(resp, engine)
    await assert_engine_idle(engine)


async def test_an_idle_engine_hands_its_logit_rows_back(client, engine, monkeypatch):
    # A drafting step asks for a logit row per drafted token: llama.cpp grows its output
    # buffer to that many rows (a MiB each on Gemma's 262k vocabulary) and zeroes them, so
    # they stay resident unless handed back.
    from edgeserve.engine import worker

    row_pages = 262144 * 4 // 4096
    monkeypatch.setattr(worker, "OUTPUT_PAGES_IDLE_S", 3600.0)
    request = body(max_tokens=40, temperature=0)
    before = await (await client.post(CHAT, json=request)).json()
    await assert_engine_idle(engine)
    assert engine.backend.resident_output_pages() > 2 * row_pages, "the rows of a drafted step"
    monkeypatch.setattr(worker, "OUTPUT_PAGES_IDLE_S", 0.0)
    engine.housekeeping()  # the engine thread waits, idle, with the old due time
    assert not engine.backend.holds_output_pages
    assert engine.backend.resident_output_pages() == 0
    after = await (await client.post(CHAT, json=request)).json()
    assert after["choices"][0]["message"] == before["choices"][0]["message"]


async def test_the_engine_thread_hands_the_rows_back_half_a_second_after_its_last_step(
    client, engine
):
    resp = await client.post(CHAT, json=body(max_tokens=24, temperature=0))
    assert resp.status == 200
    for _ in range(100):
        await asyncio.sleep(0.05)
        if not engine.backend.holds_output_pages:
            break
    assert not engine.backend.holds_output_pages, "released after OUTPUT_PAGES_IDLE_S"
    assert engine.backend.resident_output_pages() == 0


def test_the_engine_times_steps_of_several_sizes_when_it_loads(engine):
    # The curve speculation starts from, timed once at load (the session engine's later
    # estimates follow whatever the other tests ran): every size was timed. How the times
    # compare is the machine's (on a busy machine a 16-row step took 120x one row's), not
    # held here.
    curve = dict(engine.scheduler.planner.step_cost.curve)
    assert sorted(curve) == list(CALIBRATION_ROWS)
    assert all(seconds > 0 for seconds in curve.values())
