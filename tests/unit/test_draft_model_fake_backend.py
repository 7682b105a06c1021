"""Speculative decoding with a draft model, on FakeBackend and its FakeDraftContext (scripted
and batch-invariant, see fake_backend.py): answers are token for token those of one token per
step, the target's KV cache keeps only verified cells, and the draft context holds exactly
what the DraftModel recorded, through rejections, cancels, a full draft context and a broken
one. The "self" draft model drafts the scripted model's own greedy tokens; "sloppy" gets every
third one wrong."""

from __future__ import annotations

import time

import pytest

from edgeserve.engine import speculation
from edgeserve.engine.draft_model import DraftModel
from edgeserve.engine.jobs import JobState
from edgeserve.engine.types import Finished, GrammarSpec
from tests.unit.fake_backend import FakeDraftContext
from tests.unit.test_engine_fake_backend import Harness, answers, finishes
from tests.unit.test_speculation_fake_backend import CASES, REPEATING, CheapRows, per_choice

PROMPT = "the quick brown fox"


class FixedRows(CheapRows):
    """CheapRows (nothing learned from the test machine's clock), and a step of one row that
    takes `STEP_S` seconds: the draft model's own cost adds nothing to the threshold unless a
    test sets it."""

    STEP_S: float | None = None

    def generation_seconds(self, rows: int) -> float | None:
        return None if self.STEP_S is None else self.STEP_S * rows


@pytest.fixture(autouse=True)
def cheap_rows(monkeypatch) -> None:
    """FixedRows on a backend that says it is on a GPU, where seeded sampled answers draft."""
    monkeypatch.setattr(Harness, "cost", FixedRows)
    monkeypatch.setattr(Harness, "gpu", True)


def harness(draft_model: str | None, **config) -> Harness:
    """A fresh engine: speculation with `draft_model`, or none at all (None)."""
    if draft_model is None:
        return Harness(draft_max=0, **config)
    return Harness(draft_max=8, draft_model_path=draft_model, **config)


def draft_model(h: Harness) -> DraftModel:
    model = h.scheduler.draft_model
    assert model is not None
    return model


def draft_context(h: Harness) -> FakeDraftContext:
    context = h.backend.draft_context
    assert isinstance(context, FakeDraftContext)
    return context


def assert_draft_in_step(h: Harness) -> None:
    """The draft context holds exactly the tokens the DraftModel recorded, and it never
    refused a batch (every decode continued its sequences where their cells end)."""
    assert draft_context(h).seqs == draft_model(h).held
    assert draft_model(h).mismatch() is None
    assert draft_context(h).refused == 0


def run(prompt: str, model: str | None, n: int = 1, **params) -> tuple[list, Harness]:
    """The events of one request on a fresh engine, run until idle, checked clean."""
    h = harness(model)
    _, events = h.submit(prompt, n=n, **params)
    h.run_until_idle()
    h.assert_clean()
    if model is not None:
        assert_draft_in_step(h)
    return events, h


@pytest.mark.parametrize("model", ["self", "sloppy"])
@pytest.mark.parametrize("params", CASES)
def test_answers_are_those_without_speculation(model, params):
    params = dict(params)
    n = params.pop("n", 1)
    plain, off = run(PROMPT, None, n, **params)
    spec, on = run(PROMPT, model, n, **params)
    assert per_choice(spec) == per_choice(plain)
    assert on.engine.stats().draft_accepted_tokens <= on.engine.stats().draft_tokens
    if params["max_tokens"] > 3:
        assert on.engine.stats().draft_tokens > 0
    if params.get("temperature", 0.0) == 0.0 and params["max_tokens"] > 3:
        assert on.engine.stats().draft_accepted_tokens > 0
        assert len(on.backend.decodes) < len(off.backend.decodes), "fewer target steps"
        if model == "self" and "logit_bias" not in params:  # EOS banned: drafts all kept
            assert on.engine.stats().draft_accepted_tokens == on.engine.stats().draft_tokens


def test_the_target_kv_ends_as_without_speculation():
    # Two requests, sampled and greedy, with rejected drafts: every sequence's cells (the
    # prompt caches they leave) are the ones one token per step leaves.
    histories = []
    for model in (None, "sloppy"):
        h = harness(model)
        h.submit(PROMPT, max_tokens=30, temperature=0.9, seed=5)
        h.submit(REPEATING, max_tokens=25, n=2, temperature=0.0)
        h.run_until_idle()
        h.assert_clean()
        histories.append([h.backend.history(seq) for seq in range(h.config.parallel)])
        if model:
            assert 0 < h.engine.stats().draft_accepted_tokens < h.engine.stats().draft_tokens
    assert histories[0] == histories[1]


def test_sequences_draft_together_one_decode_per_position():
    h = harness("self")
    for prompt in ("abc", "defgh", "ijklmnop"):
        h.submit(prompt, max_tokens=20)
    h.run_until_idle()
    h.assert_clean()
    context = draft_context(h)
    assert max(len({seq for _, _, seq, _ in batch}) for batch in context.decodes) == 3
    assert all(len(batch) <= context.batch.capacity for batch in context.decodes)
    # An extension decode holds one token per sequence.
    for batch in context.decodes:
        if all(output for *_, output in batch):
            assert len({seq for _, _, seq, _ in batch}) == len(batch)


def test_a_long_history_catches_up_over_several_steps():
    h = harness("self")
    job, events = h.submit(PROMPT * 8, max_tokens=12)
    while job.state is not JobState.GENERATING:
        h.step()
    steps_before_a_draft = 0
    while h.engine.stats().draft_tokens == 0:
        h.step()
        steps_before_a_draft += 1
        assert_draft_in_step(h)
    capacity = draft_context(h).batch.capacity
    assert steps_before_a_draft >= len(job.tokens) // capacity
    h.run_until_idle()
    h.assert_clean()
    assert answers(events) == answers(run(PROMPT * 8, None, max_tokens=12)[0])


def test_a_cancel_mid_draft_frees_everything():
    h = harness("sloppy")
    doomed, _ = h.submit(PROMPT, max_tokens=60, temperature=0.7, seed=2)
    _, other = h.submit(REPEATING, max_tokens=40)
    context = draft_context(h)
    drafting_decodes = 0

    def cancel_while_drafting(batch):
        nonlocal drafting_decodes
        if any(seq == doomed.lead.seq_id for _, _, seq, _ in batch):
            drafting_decodes += 1
            if drafting_decodes == 6:
                h.engine.cancel(doomed)  # as the event loop's thread would, mid-step
        return None

    context.before_decode = cancel_while_drafting
    h.run_until_idle()
    h.assert_clean()
    assert_draft_in_step(h)
    assert doomed.state is JobState.CANCELLED and drafting_decodes >= 6
    assert h.engine.stats().busy_slots == 0
    assert answers(other) == answers(run(REPEATING, None, max_tokens=40)[0])


def test_a_full_draft_context_drops_the_others_and_never_fails_a_request():
    plain = [run(p, None, max_tokens=30)[0] for p in (PROMPT, REPEATING)]
    h = harness("self")
    draft_context(h).n_cells = 70  # fewer cells than the two histories need together
    _, first = h.submit(PROMPT, max_tokens=30)
    _, second = h.submit(REPEATING, max_tokens=30)
    h.run_until_idle()
    h.assert_clean()
    assert_draft_in_step(h)
    assert [answers(first), answers(second)] == [answers(e) for e in plain]
    assert finishes(first) == finishes(second) == {0: "length"}
    assert h.engine.stats().draft_accepted_tokens > 0 and draft_context(h).no_room > 0
    assert sum(map(len, draft_context(h).seqs.values())) <= 70


def test_a_finished_sequence_s_draft_cells_make_room_for_a_drafting_one():
    # The first request's two choices leave ~70 cells in the draft context; the second
    # request reuses one of their sequences and needs the other one's cells.
    accepted = []
    for n_cells in (1000, 80):
        h = harness("self")
        draft_context(h).n_cells = n_cells
        h.submit(PROMPT, n=2, max_tokens=10)
        h.run_until_idle()
        _, events = h.submit(REPEATING, max_tokens=30)
        h.run_until_idle()
        h.assert_clean()
        assert_draft_in_step(h)
        assert answers(events) == answers(run(REPEATING, None, max_tokens=30)[0])
        accepted.append(sum(e.draft_accepted for e in events if isinstance(e, Finished)))
    assert draft_context(h).no_room > 0
    assert accepted[1] >= accepted[0] - 2 > 15


def test_a_repeated_prompt_drafts_from_the_draft_cells_it_left():
    h = harness("self")
    caught_up, drafted = [], []
    for _ in range(2):
        before = len(draft_context(h).decodes)
        _, events = h.submit(PROMPT, max_tokens=20)
        h.run_until_idle()
        h.assert_clean()
        assert_draft_in_step(h)
        decodes = draft_context(h).decodes[before:]
        caught_up.append(sum(len(b) for b in decodes if not all(out for *_, out in b)))
        drafted.append(sum(e.drafted for e in events if isinstance(e, Finished)))
        assert answers(events) == answers(run(PROMPT, None, max_tokens=20)[0])
    assert h.engine.stats().draft_accepted_tokens == h.engine.stats().draft_tokens
    assert drafted[1] >= drafted[0] > 0
    assert caught_up[1] < caught_up[0] // 2, "the second answer re-decoded its prompt"


@pytest.mark.parametrize("failure", ["broken", "raises"])
def test_a_failing_draft_context_is_cleared_and_the_answer_goes_on(failure):
    h = harness("self")
    context = draft_context(h)
    decodes = 0

    def fail_now_and_then(batch):
        nonlocal decodes
        decodes += 1
        if decodes in (5, 12):
            if failure == "raises":
                raise RuntimeError("scripted draft model failure")
            return -1
        return None

    context.before_decode = fail_now_and_then
    _, events = h.submit(PROMPT, max_tokens=40)
    h.run_until_idle()
    h.assert_clean()
    assert_draft_in_step(h)
    assert answers(events) == answers(run(PROMPT, None, max_tokens=40)[0])
    assert h.engine.stats().draft_accepted_tokens > 0 and decodes >= 10


def test_grammar_answers_draft_nothing():
    letters = GrammarSpec("gbnf", "letters")
    plain, _ = run(PROMPT, None, max_tokens=20, grammar=letters)
    spec, on = run(PROMPT, "self", max_tokens=20, grammar=letters)
    assert spec == plain and on.engine.stats().draft_tokens == 0
    assert draft_context(on).decodes == []


def test_a_restart_clears_the_draft_context():
    h = harness("self")
    job, _ = h.submit(PROMPT, max_tokens=100)
    h.step(8)
    assert any(draft_model(h).held.values()) and job.state is JobState.GENERATING
    h.backend.before_decode = lambda batch: -3
    h.step()
    h.backend.before_decode = None
    assert h.engine.stats().engine_restarts == 1
    assert draft_model(h).held == {seq: [] for seq in range(h.config.parallel)}
    assert_draft_in_step(h)


def test_the_draft_model_s_cost_raises_the_threshold():
    model = DraftModel(FakeDraftContext(harness("self").config), catch_up=64)
    assert model.step_share(0.020) == 0.0  # its cost is not measured yet
    model.position_s = 0.010
    assert model.step_share(None) == 0.0  # nor the target's
    assert model.step_share(0.020) == pytest.approx(0.5)
    assert model.step_share(0.080) == pytest.approx(0.125)


@pytest.mark.parametrize("draft_s", [0.0, 0.02])
def test_a_draft_model_as_slow_as_a_step_drafts_only_probes(monkeypatch, draft_s):
    # A step of one row takes 20 ms; each draft decode draft_s (measured on the clock). The
    # first draft comes before any draft decode is measured, then only probes.
    monkeypatch.setattr(FixedRows, "STEP_S", 0.020)
    h = harness("self")
    draft_context(h).before_decode = lambda batch: time.sleep(draft_s)
    _, events = h.submit(PROMPT, max_tokens=40)
    h.run_until_idle()
    h.assert_clean()
    assert answers(events) == answers(run(PROMPT, None, max_tokens=40)[0])
    if draft_s:  # a drafted position costs a whole step: probes of PROBE_LENGTH, spaced out
        assert 0 < h.engine.stats().draft_tokens <= 8 * speculation.PROBE_LENGTH
    else:
        assert h.engine.stats().draft_tokens >= 30
