"""Speculative decoding on FakeBackend (scripted and batch-invariant, see fake_backend.py):
answers are token for token those of one token per step whatever is drafted, and the KV cache
keeps only verified cells. An oracle stands in for the n-gram lookup where a test needs drafts
accepted: the scripted model's own greedy continuation for `right` tokens, then a wrong one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from edgeserve.engine import speculation
from edgeserve.engine.draft_sizing import DRAFT_SHARE
from edgeserve.engine.jobs import JobState
from edgeserve.engine.speculation import Drafter, NgramIndex, draft_room
from edgeserve.engine.step_cost import StepCost
from edgeserve.engine.types import Finished, GrammarSpec, TokenLogprob
from tests.unit.fake_backend import EOS, FIRST_LETTER, SPACE, VOCAB, history_logits
from tests.unit.test_draft_lengths import CPU_MS
from tests.unit.test_engine_fake_backend import (
    NO_EOS,
    Harness,
    UnmeasuredCost,
    answers,
    checks_by_decode,
    finishes,
)

REPEATING = "abcd efgh abcd efgh abcd efgh abcd"
CHEAP = 0.3  # a drafted token pays when kept 30% of the time (a row costs 30% of a step)


class CheapRows(UnmeasuredCost):
    """The engine's step costs, fixed: a row costs CHEAP of a step."""

    def threshold(self, sequences: int) -> float:
        return CHEAP


@pytest.fixture(autouse=True)
def cheap_rows(monkeypatch) -> None:
    """Rows that cost CHEAP of a step, on a backend that says it is on a GPU: where every
    kind of answer drafts (on the CPU a seeded sampled answer does not, see
    test_on_the_cpu_sampled_answers_keep_their_pace)."""
    monkeypatch.setattr(Harness, "cost", CheapRows)
    monkeypatch.setattr(Harness, "gpu", True)


class MeasuredCpu(UnmeasuredCost):
    """The step costs of this machine's kernels, measured once (CPU_MS, see
    test_draft_lengths.py): drafts take the lengths that pay best (`best_lengths`)."""

    def __init__(self) -> None:
        super().__init__()
        for rows, ms in enumerate(CPU_MS, start=1):
            StepCost.record(self, rows, ms / 1000)


@pytest.fixture(params=["threshold", "best-lengths"])
def cost(request, monkeypatch) -> None:
    """Both ways of sizing drafts: before a row's cost is measured, and after."""
    if request.param == "best-lengths":
        monkeypatch.setattr(Harness, "cost", MeasuredCpu)


def oracle(right: int):
    """A `continuation` that drafts the fake model's greedy tokens, `right` of them, then a
    token the model would not pick."""

    def continuation(self: NgramIndex, k: int) -> list[int]:
        history = list(self.tokens)
        out: list[int] = []
        for i in range(k):
            row = history_logits(history)
            row[EOS] = -np.inf
            best = int(np.argmax(row))
            if i == right:
                out.append(FIRST_LETTER + (best - FIRST_LETTER + 1) % 26)
                break
            out.append(best)
            history.append(best)
        return out

    return continuation


def per_choice(events: list) -> dict[int, list]:
    """Each choice's events in order (choices interleave differently when drafts are kept),
    the speculation counts of Finished left out."""
    out: dict[int, list] = {}
    for event in events:
        if isinstance(event, Finished):
            event = replace(event, drafted=0, draft_accepted=0)
        out.setdefault(event.index, []).append(event)
    return out


def run(prompt: str, draft_max: int, n: int = 1, **params) -> tuple[list, Harness]:
    """The events of one request on a fresh engine, run until idle, checked clean."""
    h = Harness(draft_max=draft_max)
    _, events = h.submit(prompt, n=n, **params)
    h.run_until_idle()
    h.assert_clean()
    return events, h


CASES = [
    pytest.param({"max_tokens": 40}, id="greedy"),
    pytest.param({"max_tokens": 40, "temperature": 1.0, "seed": 7}, id="sampled"),
    pytest.param({"max_tokens": 30, "temperature": 0.8, "seed": 3, "n": 3}, id="n3"),
    pytest.param({"max_tokens": 40, "stop": ["q", "zz"]}, id="stop-strings"),
    pytest.param({"max_tokens": 25, "logprobs": 3}, id="logprobs"),
    pytest.param({"max_tokens": 40, "logit_bias": {}}, id="eos-allowed"),
    pytest.param({"max_tokens": 3}, id="short"),
]


@pytest.fixture(params=[0, 1, 3, 64], ids=lambda r: f"right{r}")
def oracle_drafts(request, monkeypatch) -> Iterator[int]:
    monkeypatch.setattr(NgramIndex, "continuation", oracle(request.param))
    yield request.param


@pytest.mark.parametrize("params", CASES)
def test_answers_are_those_of_one_token_per_step(oracle_drafts, params, cost):
    params = dict(params)
    n = params.pop("n", 1)
    plain, off = run(REPEATING, 0, n, **params)
    spec, on = run(REPEATING, 8, n, **params)
    assert per_choice(spec) == per_choice(plain)
    assert off.engine.stats().draft_tokens == 0
    assert on.engine.stats().draft_tokens > 0 or params["max_tokens"] <= 3
    if oracle_drafts and params.get("temperature", 0.0) == 0.0 and params["max_tokens"] > 3:
        assert on.engine.stats().draft_accepted_tokens > 0, (
            "the oracle's drafts are the greedy answer"
        )
        assert len(on.backend.decodes) < len(off.backend.decodes), "fewer steps"
    assert on.engine.stats().draft_accepted_tokens <= on.engine.stats().draft_tokens
    counted = [e for e in spec if isinstance(e, Finished)]
    assert sum(e.drafted for e in counted) == on.engine.stats().draft_tokens
    assert sum(e.draft_accepted for e in counted) == on.engine.stats().draft_accepted_tokens


# The scripted model writes random letters, whose n-grams seldom occurred before: left with
# "a", "b" and a space (and EOS where a case allows it) it repeats itself and the prompt, so
# the n-gram index drafts, and some drafts are kept.
A_B_SPACE = {
    token: -100.0
    for token in range(VOCAB)
    if token not in (EOS, FIRST_LETTER, FIRST_LETTER + 1, SPACE)
}


@pytest.mark.parametrize("params", CASES)
def test_n_gram_drafts_keep_the_answer(params, cost):
    params = dict(params)
    n = params.pop("n", 1)
    params["logit_bias"] = {**params.get("logit_bias", NO_EOS), **A_B_SPACE}
    plain, _ = run(REPEATING * 3, 0, n, **params)
    spec, on = run(REPEATING * 3, 8, n, **params)
    assert per_choice(spec) == per_choice(plain)
    assert on.engine.stats().draft_tokens > 0, "the n-gram index drafted nothing"
    kept = on.engine.stats().draft_accepted_tokens
    assert kept > 0 or params["max_tokens"] <= 3, "no draft was kept"


def test_grammar_answers_draft_nothing():
    letters = GrammarSpec("gbnf", "letters")
    plain, _ = run(REPEATING, 0, max_tokens=20, grammar=letters)
    spec, on = run(REPEATING, 8, max_tokens=20, grammar=letters)
    assert spec == plain and on.engine.stats().draft_tokens == 0


def test_drafts_beside_other_streams_and_a_cancel_leave_only_verified_cells(monkeypatch):
    monkeypatch.setattr(NgramIndex, "continuation", oracle(2))
    h = Harness(draft_max=8)
    _, first = h.submit(REPEATING, max_tokens=50)
    doomed, _ = h.submit("xyz " + REPEATING, max_tokens=50)
    h.step(6)
    h.engine.cancel(doomed)
    _, third = h.submit("abcd", max_tokens=20, n=2, temperature=1.0, seed=1)
    h.run_until_idle()
    h.assert_clean()
    assert h.engine.stats().draft_accepted_tokens > 0
    assert answers(first) == answers(run(REPEATING, 0, max_tokens=50)[0])
    assert answers(third, 2) == answers(
        run("abcd", 0, 2, max_tokens=20, temperature=1.0, seed=1)[0], 2
    )


def test_an_end_inside_a_draft_ends_there(monkeypatch):
    monkeypatch.setattr(NgramIndex, "continuation", oracle(64))
    plain, _ = run(REPEATING, 0, max_tokens=40, stop=["e"])
    spec, on = run(REPEATING, 8, max_tokens=40, stop=["e"])
    assert per_choice(spec) == per_choice(plain) and on.engine.stats().draft_tokens > 0
    assert finishes(spec) == {0: "stop"}


def test_logprobs_come_from_each_verified_row(monkeypatch):
    monkeypatch.setattr(NgramIndex, "continuation", oracle(64))
    spec, on = run(REPEATING, 8, max_tokens=12, logprobs=2)
    plain, _ = run(REPEATING, 0, max_tokens=12, logprobs=2)
    assert on.engine.stats().draft_accepted_tokens > 0
    entries = [e for e in spec if isinstance(e, TokenLogprob)]
    assert len(entries) == 12 and all(len(e.top) == 2 for e in entries)
    # FakeBackend's rows do not depend on the batch: the values are those of one row a step.
    assert entries == [e for e in plain if isinstance(e, TokenLogprob)]


# ---- the n-gram index and the adaptive drafter (pure logic) ----------------------------------


def test_continuation_follows_the_latest_earlier_occurrence_of_the_longest_tail():
    index = NgramIndex()
    index.extend([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3])
    assert index.continuation(3) == [7, 5, 1]
    index.extend([8])
    assert index.continuation(3) == []  # "3 8" and "8" never occurred before
    index.extend([1, 2])
    assert index.continuation(2) == [3, 8]


def test_continuation_needs_a_repeated_tail_of_two_tokens():
    index = NgramIndex()
    index.extend([5, 6, 7, 5])
    assert index.continuation(4) == []
    index.extend([6])
    assert index.continuation(4) == [7, 5, 6]


def test_a_drafter_drafts_the_positions_likely_enough_to_be_kept():
    drafter = Drafter([*range(1, 40), 1, 2])
    a = drafter.acceptance
    assert a == speculation.PRIOR_KEPT / (speculation.PRIOR_KEPT + speculation.PRIOR_MISSED)
    assert a**2 > 0.5 > a**3
    assert drafter.draft([], 64, 0.5) == [3, 4]
    assert drafter.length(0.0) == speculation.STEP_ROWS  # rows cost nothing
    assert drafter.length(a) == 0
    assert len(drafter.draft([], 5, 0.0)) == 5  # never more than the room
    for _ in range(6):
        drafter.adapt(8, 8)  # drafts kept whole: longer drafts
    assert drafter.acceptance > 0.95 and drafter.length(0.7) >= 8
    drafter.adapt(8, 1)
    drafter.adapt(8, 0)
    assert drafter.length(0.7) < 8  # two misses in a row: shorter again


def waits(drafter: Drafter, threshold: float) -> int:
    """Steps without a draft before the next one."""
    for steps in range(200):
        if drafter.draft([], 64, threshold):
            return steps
    raise AssertionError("never drafts again")


def test_drafts_that_do_not_pay_become_spaced_out_probes():
    drafter = Drafter([*range(1, 40), 1, 2])
    for _ in range(4):
        drafter.adapt(4, 0)
    assert drafter.length(0.7) == 0
    gaps = []
    for _ in range(8):
        gaps.append(waits(drafter, 0.7))
        drafter.adapt(speculation.PROBE_LENGTH, 0)
    assert gaps == [0, 1, 2, 4, 8, 16, 32, 64], gaps
    assert len(drafter.draft([], 64, 0.7)) in (0, speculation.PROBE_LENGTH)
    for _ in range(8):
        drafter.adapt(2, 2)  # the answer started copying: probes are kept whole
    assert waits(drafter, 0.7) <= speculation.MAX_BACKOFF
    assert waits(drafter, 0.7) == 0 and drafter.length(0.7) > speculation.PROBE_LENGTH


def test_drafter_reads_the_answer_as_it_grows():
    drafter = Drafter([7, 8, 9])
    assert drafter.draft([], 4, CHEAP) == []
    assert drafter.draft([7, 8], 4, 0.0) == [9, 7, 8]
    assert drafter.draft([7, 8], 0, 0.0) == []


def test_draft_room_shrinks_as_more_sequences_generate():
    rows = speculation.STEP_ROWS
    assert draft_room(1, 8) == 8 and draft_room(1, 64) == rows - 1
    assert draft_room(4, 64) == rows // 4 - 1
    assert draft_room(rows, 64) == 0
    assert draft_room(1, 0) == 0 and draft_room(0, 8) == 0


class RowCost(CheapRows):
    """A step costs FIXED + ROW per logit row."""

    FIXED, ROW = 0.006, 0.014  # ~a 2-core CPU: a row is most of a step

    def generation_seconds(self, rows: int) -> float | None:
        return self.FIXED + self.ROW * rows

    def row_seconds(self) -> float:
        return self.ROW


class FastRowCost(RowCost):
    FIXED, ROW = 0.010, 0.002  # a row is a ninth of a 4-row step


def drafted_rows(decode: list[tuple]) -> int:
    """Output rows beyond one per sequence (the drafts) in a decode of generating streams."""
    outputs = [seq for _, _, seq, out in decode if out]
    return len(outputs) - len(set(outputs))


@pytest.mark.parametrize(("cost", "most"), [(RowCost, 0), (FastRowCost, 1)], ids=["cpu", "fast"])
def test_beside_other_streams_drafts_stretch_the_step_by_at_most_the_share(monkeypatch, cost, most):
    # 4 streams whose drafts are always right, before a row's cost is measured in steps of
    # several sizes (the threshold's way): the drafts of a step may add DRAFT_SHARE (15%) of
    # a 4-row step, no CPU row (62 ms, a row 14 ms) and one where a row costs 2 ms of 18.
    monkeypatch.setattr(NgramIndex, "continuation", oracle(64))
    monkeypatch.setattr(Harness, "cost", cost)
    h = Harness(draft_max=8, n_batch=128, n_ctx=512)
    jobs = [h.submit(REPEATING, max_tokens=60)[0] for _ in range(4)]
    h.step(3)
    assert all(job.state is JobState.GENERATING for job in jobs)
    h.step(3)
    assert [drafted_rows(d) for d in h.backend.decodes[-3:]] == [most] * 3
    h.run_until_idle()
    h.assert_clean()


def test_a_stream_alone_drafts_what_pays(monkeypatch):
    monkeypatch.setattr(NgramIndex, "continuation", oracle(64))
    monkeypatch.setattr(Harness, "cost", RowCost)
    h = Harness(draft_max=8, n_batch=128)
    job, _ = h.submit(REPEATING, max_tokens=30)
    h.step(2)
    assert job.state is JobState.GENERATING
    h.step()
    pays = Drafter([]).length(CHEAP)  # what a new sequence's prior acceptance pays for
    assert 0 < pays < 8 and drafted_rows(h.backend.decodes[-1]) == pays
    h.run_until_idle()
    h.assert_clean()


class MeasuredGpu(UnmeasuredCost):
    """Step costs where rows are cheap, measured once: 10 ms a step, 0.2 ms a row."""

    def __init__(self) -> None:
        super().__init__()
        for rows in range(1, 41):
            StepCost.record(self, rows, 0.010 + 0.0002 * rows)


def test_a_seeded_sampled_answer_drafts_by_its_own_acceptance(monkeypatch):
    # On the real CPU build a row's values depend on the batch's shape, and the measured
    # costs on what else ran: a seeded sampled answer drafts against the prior threshold,
    # so the same seed drafts alike, and samples alike, whatever the costs say.
    monkeypatch.setattr(NgramIndex, "continuation", oracle(64))
    runs = []
    for cost in (MeasuredCpu, MeasuredGpu):
        monkeypatch.setattr(Harness, "cost", cost)
        events, h = run(REPEATING, 8, max_tokens=30, temperature=1.0, seed=7)
        assert h.engine.stats().draft_tokens > 0
        runs.append((h.backend.decodes, answers(events)))
    assert runs[0] == runs[1]
    for cost in (MeasuredCpu, MeasuredGpu):  # unseeded, the costs decide
        monkeypatch.setattr(Harness, "cost", cost)
        runs.append(run(REPEATING, 8, max_tokens=30, temperature=1.0)[1].backend.decodes)
    assert [len(d) for d in runs[2]] != [len(d) for d in runs[3]]


def most_drafted(h: Harness) -> int:
    """The most drafted rows any of the harness's decodes carried."""
    return max(drafted_rows(decode) for decode in h.backend.decodes)


def test_on_the_cpu_greedy_streams_that_all_copy_draft_together(monkeypatch):
    # Four streams whose drafts are always kept, on this CPU's costs: greedy, they draft
    # together (each one's own rate stays within the share of its plain pace); a step that
    # a sampled stream takes part in drafts no more than keeps it within DRAFT_SHARE of the
    # step without drafts (its gap is held to the plain bound; four rows cost about what
    # three do here, so a step of three streams may draft one). The greedy answers are the
    # same either way.
    monkeypatch.setattr(NgramIndex, "continuation", oracle(64))
    monkeypatch.setattr(Harness, "cost", MeasuredCpu)
    results = {}
    for mix in ("greedy", "one sampled"):
        h = Harness(draft_max=8)
        submitted = []
        for i in range(4):
            params = {"temperature": 0.05} if mix == "one sampled" and i == 3 else {}
            submitted.append(h.submit(REPEATING + "abcd"[i], max_tokens=30, **params))
        h.run_until_idle()
        h.assert_clean()
        sampled_seq = submitted[3][0].choices[0].seq_id
        generating = [d for d in h.backend.decodes if all(out for *_, out in d)]  # no prefill
        with_sampled = [d for d in generating if any(s == sampled_seq for *_, s, _ in d)]
        results[mix] = (h, with_sampled, [answers(events) for _, events in submitted[:3]])
    assert most_drafted(results["greedy"][0]) >= 8
    line = MeasuredCpu()
    assert results["one sampled"][1]
    for decode in results["one sampled"][1]:
        plain = len({seq for _, _, seq, out in decode if out})
        drafted = line.generation_seconds(plain + drafted_rows(decode))
        assert drafted <= (1 + DRAFT_SHARE) * line.generation_seconds(plain)
    assert results["greedy"][2] == results["one sampled"][2]


def test_on_the_cpu_sampled_answers_keep_their_pace(monkeypatch):
    # Drafts that are always the greedy answer, from a backend on the CPU. A greedy stream
    # alone drafts what pays; a sampled one (nearly greedy, so its drafts are kept) only what
    # keeps its step within DRAFT_SHARE: nothing where one more row doubles a step, at most 7
    # rows where a row is 0.2 ms of 10. A seeded sampled answer, whose drafts may not follow
    # the measured costs, drafts nothing at all.
    monkeypatch.setattr(NgramIndex, "continuation", oracle(64))
    monkeypatch.setattr(Harness, "gpu", False)
    sampled = {"max_tokens": 30, "temperature": 0.05}
    monkeypatch.setattr(Harness, "cost", MeasuredCpu)
    assert most_drafted(run(REPEATING, 8, max_tokens=30)[1]) >= 4
    assert most_drafted(run(REPEATING, 8, **sampled)[1]) == 0
    monkeypatch.setattr(Harness, "cost", MeasuredGpu)
    assert 0 < most_drafted(run(REPEATING, 8, **sampled)[1]) <= 7
    assert most_drafted(run(REPEATING, 8, max_tokens=30)[1]) == 8
    for cost in (MeasuredCpu, MeasuredGpu):
        monkeypatch.setattr(Harness, "cost", cost)
        events, h = run(REPEATING, 8, seed=7, **sampled)
        assert h.engine.stats().draft_tokens == 0
        assert answers(events) == answers(run(REPEATING, 0, seed=7, **sampled)[0])


def test_every_step_with_a_draft_checks_the_invariants(monkeypatch):
    """A drafted step keeps or cuts cells as its tokens verify: it is never a routine step
    (stepper.py), whose invariant check runs only once in a few."""
    monkeypatch.setattr(NgramIndex, "continuation", oracle(1))
    h = Harness(draft_max=8)
    checks = checks_by_decode(monkeypatch, h)
    h.submit(REPEATING, max_tokens=40)
    h.run_until_idle()
    drafted = [
        i + 1 for i, batch in enumerate(h.backend.decodes) if sum(row[3] for row in batch) > 1
    ]
    assert len(drafted) > 5 and set(drafted) <= set(checks)
    h.assert_clean()
