"""The engine's job lifecycle and scheduling policy, driven step by step on FakeBackend (a
scripted, batch-invariant stand-in for llama.cpp: see fake_backend.py). The engine's steps
check the scheduler's invariants (stepper.py says when) and `assert_clean` checks them once
more; a failed check would make the context anew, so each test ends by asserting that never
happened."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import pytest

from edgeserve.engine import generating, worker
from edgeserve.engine import stepper as stepper_module
from edgeserve.engine.invariants import InvariantError
from edgeserve.engine.jobs import Job, JobState, Prompt, ScoreJob, Sink
from edgeserve.engine.policy import Scheduler
from edgeserve.engine.step_clock import StepClock
from edgeserve.engine.step_cost import StepCost
from edgeserve.engine.types import (
    AdapterSet,
    ChatPrompt,
    ChatTurn,
    EngineConfig,
    Finished,
    GenerationRequest,
    GrammarSpec,
    SamplingParams,
    ScoreRequest,
    ScoreResult,
    TextDelta,
    TokenLogprob,
    TokenPrompt,
)
from edgeserve.engine.worker import Engine
from edgeserve.errors import (
    EngineFault,
    EngineRestarted,
    InvalidPrompt,
    PromptTooLong,
    UnknownToken,
)
from tests.unit.fake_backend import (
    BOS,
    EOS,
    FIRST_LETTER,
    GRAMMAR_RAISES_ON_ADMIT,
    GRAMMAR_RAISES_ON_SAMPLE,
    GRAMMAR_SLOW,
    GRAMMAR_STAGGERED,
    SEED_RAISES,
    VOCAB,
    FakeBackend,
    FakeSampler,
)
from tests.unit.loop_handlers import Handler, handlers

NO_EOS = {EOS: -100.0}


class InlineLoop:
    """Delivers the engine's events at once, on the engine's own thread."""

    def call_soon_threadsafe(self, callback, *args):
        callback(*args)


class UnmeasuredCost(StepCost):
    """Step costs that learn nothing: the fake backend's decode times are not a machine's, so
    prefill takes `prefill_chunk` beside streams and drafts face the prior threshold."""

    def record(self, rows: int, seconds: float, prompt_tokens: int = 0) -> None:
        return


class Harness:
    """An Engine on a FakeBackend, stepped by the test (no engine thread). `cost` is the
    scheduler's StepCost; `gpu`, whether the backend says its layers are offloaded."""

    cost: type[StepCost] = UnmeasuredCost
    gpu: bool = False

    def __init__(self, window: int = 0, budget: int | None = None, **config) -> None:
        defaults = {"model_path": "fake", "n_ctx": 256, "parallel": 4, "n_batch": 64}
        self.config = EngineConfig(**{**defaults, **config, "prefill_chunk": 8})
        self.engine = Engine(
            self.config,
            backend_factory=partial(FakeBackend, window=window, budget=budget, gpu=self.gpu),
        )
        assert self.engine.load()
        self.backend: FakeBackend = self.engine.backend  # type: ignore[assignment]
        self.scheduler: Scheduler = self.engine.scheduler  # type: ignore[assignment]
        self.scheduler.planner.step_cost = self.cost()

    def submit(
        self,
        prompt: str | TokenPrompt = "hello there",
        n: int = 1,
        adapters: AdapterSet = (),
        **params,
    ) -> tuple[Job, list]:
        params.setdefault("max_tokens", 6)
        params.setdefault("temperature", 0.0)
        params.setdefault("logit_bias", NO_EOS)
        request = GenerationRequest(
            prompt=prompt, params=SamplingParams(**params), n=n, adapters=adapters
        )
        events: list = []
        job = self.engine.submit(
            request, self.engine.prepare(request), Sink(InlineLoop(), events.append)
        )
        return job, events

    def score(
        self, *texts: str | TokenPrompt, top: int | None = None, adapters: AdapterSet = ()
    ) -> tuple[ScoreJob, list]:
        request = ScoreRequest(texts=texts, top_logprobs=top, adapters=adapters)
        events: list = []
        sink = Sink(InlineLoop(), events.append)
        return self.engine.submit_score(request, self.engine.prepare_score(request), sink), events

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            self.engine.step()

    def run_until_idle(self, limit: int = 500) -> int:
        for steps in range(limit):
            if not self.scheduler.live_jobs() and self.engine.stats().queue_length == 0:
                return steps
            if not self.scheduler.has_work():
                time.sleep(0.001)  # a detached (grammar) sample is on its way
            self.engine.step()
        raise AssertionError("the engine did not go idle")

    def assert_clean(self, restarts: int = 0) -> None:
        """Idle, consistent, nothing leaked: KV holds only the prompt caches. `restarts`: the
        contexts the test made the engine make anew."""
        self.scheduler.check_invariants()
        assert not self.scheduler.has_work()
        assert not self.scheduler.live_jobs()
        assert self.scheduler.reserved == 0
        assert self.engine.stats().engine_restarts == restarts and self.backend.resets == restarts
        assert FakeSampler.live == 0
        stats = self.engine.stats()
        assert stats.busy_slots == 0
        # The fake's own count of the cells it holds, against the scheduler's record.
        assert stats.kv_cells_used == self.backend.cells_used()
        assert self.backend.cells_used() == stats.prefix_cache_cells, stats


def answers(events: list, n: int = 1) -> list[str]:
    texts = [""] * n
    for event in events:
        if isinstance(event, TextDelta):
            texts[event.index] += event.text
    return texts


def finishes(events: list) -> dict[int, str]:
    return {e.index: e.reason for e in events if isinstance(e, Finished)}


def fresh_answer(prompt: str | TokenPrompt, n: int = 1, **params) -> list[str]:
    """What a cold engine answers alone."""
    harness = Harness()
    _, events = harness.submit(prompt, n=n, **params)
    harness.run_until_idle()
    return answers(events, n)


# ---- cancel in every state ------------------------------------------------------------------


def test_cancel_while_queued_never_decodes_it():
    h = Harness(parallel=1)
    _, first_events = h.submit("aaaa")
    second, second_events = h.submit("bbbb")
    h.step()
    assert second.state is JobState.QUEUED
    h.engine.cancel(second)
    h.run_until_idle()
    assert second.state is JobState.CANCELLED and second_events == []
    assert all(seq == 0 for batch in h.backend.decodes for _, _, seq, _ in batch)
    assert finishes(first_events) == {0: "length"}
    h.assert_clean()


def test_cancel_mid_prefill_while_another_waits_for_the_sequence():
    # One sequence; a long prompt prefills in 8-token chunks beside a generating stream, and a
    # request with the same prefix waits. Cancel the long one mid-prefill: the waiter takes the
    # freed sequence (prefix match) and its decode must continue exactly at the stored end.
    h = Harness(parallel=2, n_batch=16)
    _, stream_events = h.submit("zz", max_tokens=40)
    h.step(2)
    long_prompt = "the quick brown fox jumps over the lazy dog " * 2
    doomed, _ = h.submit(long_prompt, max_tokens=4)
    h.step(3)
    assert doomed.state is JobState.PREFILLING and 0 < doomed.prefilled < len(doomed.tokens)
    waiter, waiter_events = h.submit(long_prompt + "and more", max_tokens=5)
    h.engine.cancel(doomed)
    h.step()
    assert doomed.state is JobState.CANCELLED
    assert waiter.state is JobState.PREFILLING and waiter.cached > 0
    h.run_until_idle()
    assert finishes(waiter_events) == {0: "length"}
    assert answers(waiter_events) == fresh_answer(long_prompt + "and more", max_tokens=5)
    assert finishes(stream_events) == {0: "length"}
    h.assert_clean()


def test_cancel_while_generating_frees_the_sequence_and_the_engine_goes_idle():
    h = Harness()
    job, events = h.submit(max_tokens=100)
    _, other_events = h.submit("another prompt", max_tokens=10)
    h.step(4)
    h.engine.cancel(job)
    h.step()
    assert job.state is JobState.CANCELLED and job not in h.scheduler.active
    h.run_until_idle()
    assert finishes(other_events) == {0: "length"}
    assert not any(isinstance(e, Finished) for e in events)
    h.assert_clean()


def test_cancel_of_the_last_stream_leaves_nothing_to_step():
    h = Harness()
    job, _ = h.submit(max_tokens=100)
    h.step(3)
    h.engine.cancel(job)
    h.step()
    decodes = len(h.backend.decodes)
    assert not h.scheduler.has_work()
    h.step(5)  # a step with nothing to do decodes nothing
    assert len(h.backend.decodes) == decodes
    h.assert_clean()


def test_cancel_twice_and_after_the_end_is_harmless():
    h = Harness()
    job, events = h.submit(max_tokens=3)
    h.run_until_idle()
    h.engine.cancel(job)
    h.engine.cancel(job)
    h.run_until_idle()
    assert finishes(events) == {0: "length"}
    h.assert_clean()


def test_cancel_of_a_score_job():
    h = Harness()
    job, events = h.score("some text to score " * 10)
    h.step(2)
    h.engine.cancel(job)
    h.run_until_idle()
    assert job.state is JobState.CANCELLED and events == []
    h.assert_clean()


# ---- n > 1, seeds, the prefix cache ---------------------------------------------------------


def test_sampled_choices_copy_the_prompt_and_match_single_requests():
    h = Harness()
    _, events = h.submit("once upon a time", n=3, temperature=1.0, seed=7, max_tokens=8)
    h.run_until_idle()
    got = answers(events, 3)
    assert len(set(got)) > 1  # the seeds differ, so the answers should too
    for i in range(3):
        alone = fresh_answer("once upon a time", temperature=1.0, seed=7 + i, max_tokens=8)
        assert got[i] == alone[0], i
    h.assert_clean()


def test_warm_prefix_cache_answers_like_a_cold_engine():
    h = Harness()
    h.submit("a shared beginning then one", max_tokens=5)
    h.run_until_idle()
    job, second = h.submit("a shared beginning then two", max_tokens=5)
    h.run_until_idle()
    assert job.cached > 10
    assert answers(second) == fresh_answer("a shared beginning then two", max_tokens=5)
    h.assert_clean()


def test_cells_a_sliding_window_left_behind_are_neither_a_fault_nor_reused():
    # llama.cpp gives a sequence's cells that its window left behind to other sequences
    # (Gemma 3: 512 positions): its first position moves up. That is no broken context; a
    # prefix is reused only when the next position's window still finds all it needs.
    h = Harness()
    h.backend.n_swa = 8
    first, _ = h.submit("a shared beginning then one", max_tokens=3)
    h.run_until_idle()
    seq = first.lead.seq_id
    h.backend.swa_lost[seq] = 6  # positions 0-5 went to other sequences
    h.step()  # the invariant check passes: a restart would show in assert_clean
    near, second = h.submit("a shared beginning then two", max_tokens=3)
    h.run_until_idle()
    assert near.cached > 10  # its window (from position cached - 7) starts past 5
    assert answers(second) == fresh_answer("a shared beginning then two", max_tokens=3)
    for held in range(h.backend.n_seq):
        if h.backend.history(held):
            h.backend.swa_lost[held] = 6
    far, third = h.submit("a shared b", max_tokens=3)  # 11 tokens: the last one's window is 3-10
    h.run_until_idle()
    assert far.cached == 0  # positions 3-5 are gone: the prompt is decoded again
    assert answers(third) == fresh_answer("a shared b", max_tokens=3)
    h.assert_clean()


def test_a_lost_first_position_without_a_sliding_window_is_a_broken_context():
    h = Harness()
    job, _ = h.submit("a shared beginning", max_tokens=3)
    h.run_until_idle()
    h.backend.swa_lost[job.lead.seq_id] = 2
    h.step()
    assert h.engine.stats().engine_restarts == 1


def test_choices_sharing_their_prompt_count_its_cells_once():
    # n=4 on a prompt of 100 tokens in 256 cells: the prompt four times would not fit. Each
    # choice decodes 5 of its 6 tokens (the last one is sampled, never decoded).
    h = Harness(n_ctx=256, parallel=4)
    job, events = h.submit("p" * 99, n=4, temperature=1.0, seed=5, max_tokens=6)
    while job.state is not JobState.DONE:
        h.step()
        stats = h.engine.stats()  # published now, or up to PUBLISH_EVERY_S ago
        assert h.backend.cells_used() <= stats.n_ctx and stats.kv_cells_used <= stats.n_ctx
    assert finishes(events) == dict.fromkeys(range(4), "length")
    assert h.engine.stats().kv_cells_used == h.backend.cells_used() == 100 + 4 * 5
    h.assert_clean()


# ---- the KV cache full ----------------------------------------------------------------------


def test_kv_full_ends_a_generating_choice_never_a_prefilling_lead():
    # 128 cells, a 32-cell share each. A stream runs past its share; an n=2 request with a
    # 72-token prompt is admitted beside it and prefills. Its last chunk does not fit: its
    # lead then holds more cells (64) than the stream (57), yet the stream is what ends
    # ("length"), and the two answers are those of a cold engine.
    h = Harness(n_ctx=128, parallel=4, n_batch=16)
    _, stream = h.submit("xxx", max_tokens=300, temperature=1.0, seed=1)
    h.step(46)
    prompt = "y" * 71
    job, events = h.submit(prompt, n=2, temperature=1.0, seed=3, max_tokens=2)
    for _ in range(10):
        h.step()
        assert job.state is not JobState.CANCELLED
    assert finishes(stream) == {0: "length"}
    assert sum(isinstance(e, TextDelta) for e in stream) < 60  # cut short by the full cache
    h.run_until_idle()
    assert finishes(events) == {0: "length", 1: "length"}
    cold = [fresh_answer(prompt, temperature=1.0, seed=3 + i, max_tokens=2)[0] for i in range(2)]
    assert answers(events, 2) == cold
    h.assert_clean()


def test_kv_full_with_only_prefilling_jobs_requeues_the_newest():
    h = Harness(parallel=2, n_batch=16)
    first, first_events = h.submit("a" * 30, max_tokens=4)
    second, second_events = h.submit("b" * 30, max_tokens=4)
    h.step()
    assert first.state is second.state is JobState.PREFILLING
    h.backend.before_decode = lambda batch: 1 if len(h.backend.decodes) == 2 else None
    h.step()
    assert second.state is JobState.QUEUED and first.state is JobState.PREFILLING
    h.run_until_idle()
    assert finishes(first_events) == {0: "length"} and finishes(second_events) == {0: "length"}
    assert answers(second_events) == fresh_answer("b" * 30, max_tokens=4)
    h.assert_clean()


def test_relieve_kv_puts_a_prefilling_job_back_whole():
    h = Harness(parallel=2, n_batch=16)
    a, _ = h.submit("a" * 30)
    b, _ = h.submit("b" * 30)
    h.step()
    assert a.state is JobState.PREFILLING and b.state is JobState.PREFILLING
    assert h.scheduler.relieve_kv() is b
    assert b.state is JobState.QUEUED and b.choices == [] and h.scheduler.waiting[0] is b
    h.scheduler.check_invariants()
    h.run_until_idle()
    h.assert_clean()


# ---- reservations and admission -------------------------------------------------------------


def test_reservations_hold_back_a_request_that_does_not_fit_and_add_up():
    h = Harness(n_ctx=128, parallel=4)
    big, big_events = h.submit("p" * 40, max_tokens=100)
    h.step()
    later, later_events = h.submit("q" * 40, max_tokens=100)
    h.step()
    assert later.state is JobState.QUEUED  # 40 + 32 + 40 + 32 > 128
    assert h.scheduler.reserved == big.prompt.reserve
    assert h.engine.stats().queue_length == 1
    h.run_until_idle()
    assert finishes(big_events) == {0: "length"} and finishes(later_events) == {0: "length"}
    h.assert_clean()


def test_a_request_alone_is_always_admitted():
    h = Harness(n_ctx=64, parallel=4)
    job, events = h.submit("r" * 50, max_tokens=None)
    h.run_until_idle()
    assert finishes(events) == {0: "length"}
    assert job.choices[0].n_gen == 64 - len(job.tokens)
    h.assert_clean()


def test_prefill_shares_a_step_with_running_streams():
    h = Harness(n_batch=64)
    _, _ = h.submit("s", max_tokens=30)
    h.step(2)
    h.submit("t" * 50, max_tokens=2)
    h.step()
    last = h.backend.decodes[-1]
    generating = [t for t in last if t[3] and t[2] == 0]
    prefill = [t for t in last if t[2] != 0]
    assert len(generating) == 1 and len(prefill) == 8  # prefill_chunk while a stream runs
    h.run_until_idle()
    h.assert_clean()


class ScriptedCost(UnmeasuredCost):
    """Fixed step costs: 20 ms a logit row, 2 ms a prompt token."""

    def generation_seconds(self, rows: int) -> float | None:
        return 0.020 * rows

    def row_seconds(self) -> float:
        return 0.020

    def token_seconds(self) -> float | None:
        return 0.002


def prompt_tokens_in(decode: list[tuple], job: Job) -> int:
    return sum(1 for t in decode if t[2] == job.lead.seq_id)


def test_prefill_beside_streams_keeps_the_step_within_twice_its_time(monkeypatch):
    monkeypatch.setattr(Harness, "cost", ScriptedCost)
    h = Harness(n_batch=128)
    stream, _ = h.submit("s", max_tokens=40)
    h.step(2)
    long_job, _ = h.submit("t" * 95, max_tokens=2)
    newer, _ = h.submit("v" * 20, max_tokens=2)
    h.step()
    # One stream: its step costs 20 ms, so 20 ms of prompt tokens (10) may join it, all of
    # them the older prompt's (FIFO).
    assert prompt_tokens_in(h.backend.decodes[-1], long_job) == 10
    assert prompt_tokens_in(h.backend.decodes[-1], stream) == 1
    assert len(h.backend.decodes[-1]) == 11
    while long_job.prefilled + 10 < len(long_job.tokens):
        h.step()
    left = len(long_job.tokens) - long_job.prefilled
    assert 0 < left < 10
    h.step()
    # The prompt's last chunk also costs its logit row (20 ms = 10 tokens): the newer prompt
    # gets none of the budget its tokens leave.
    assert prompt_tokens_in(h.backend.decodes[-1], long_job) == left
    assert long_job.state is JobState.GENERATING and newer.prefilled == 0
    h.run_until_idle()
    h.assert_clean()


def test_prefill_beside_more_streams_takes_more_prompt_tokens(monkeypatch):
    monkeypatch.setattr(Harness, "cost", ScriptedCost)
    h = Harness(n_batch=128)
    for letter in "abc":
        h.submit(letter, max_tokens=30)
    h.step(3)
    job, _ = h.submit("w" * 100, max_tokens=2)
    h.step()
    assert prompt_tokens_in(h.backend.decodes[-1], job) == 30  # 3 streams: 60 ms, 30 tokens
    h.run_until_idle()
    h.assert_clean()


def test_prefill_takes_at_least_prefill_chunk_beside_streams(monkeypatch):
    class SlowPrompts(ScriptedCost):
        def token_seconds(self) -> float | None:
            return 0.050  # a prompt token costs more than the whole step

    monkeypatch.setattr(Harness, "cost", SlowPrompts)
    h = Harness(n_batch=128)
    h.submit("s", max_tokens=30)
    h.step(2)
    job, _ = h.submit("t" * 50, max_tokens=2)
    h.step()
    assert prompt_tokens_in(h.backend.decodes[-1], job) == 8  # prefill_chunk: it still advances
    h.run_until_idle()
    h.assert_clean()


def test_a_prompts_last_token_is_decoded_in_a_chunk_of_its_own():
    h = Harness(n_batch=64)
    job, _ = h.submit("u" * 20, max_tokens=2)
    h.step()
    assert [len(batch) for batch in h.backend.decodes] == [20]  # BOS + 19 of 21 tokens
    h.step()
    assert len(h.backend.decodes[-1]) == 1 and job.state is JobState.GENERATING
    h.run_until_idle()
    h.assert_clean()


@contextlib.contextmanager
def threaded_engine(**config) -> Iterator[Engine]:
    """An Engine on FakeBackend with its own thread, as the server runs it."""
    defaults = {"model_path": "fake", "n_ctx": 256, "parallel": 4, "n_batch": 64}
    engine = Engine(EngineConfig(**{**defaults, **config}), backend_factory=FakeBackend)
    engine.start()
    try:
        assert engine.wait_loaded(5)
        yield engine
    finally:
        engine.close()


def test_the_burst_window_puts_simultaneous_requests_in_one_first_step(monkeypatch):
    # Requests 20 ms apart (a burst, slowed down so that a loaded machine cannot blur it), each
    # on its way through a prepare thread, reach an idle engine whose window is 200 ms: all
    # three share the first step.
    monkeypatch.setattr(worker, "BURST_WINDOW_S", 0.2)
    with threaded_engine() as engine:
        events: list = []
        sink = Sink(InlineLoop(), events.append)
        requests = [
            GenerationRequest(prompt, SamplingParams(max_tokens=2, temperature=0))
            for prompt in ("aaa", "bbb", "ccc")
        ]

        def prepare_after(request: GenerationRequest, delay: float) -> Prompt:
            time.sleep(delay)
            return engine.prepare(request)

        preparing = [
            engine.on_prepare_thread(prepare_after, request, 0.02 * i)
            for i, request in enumerate(requests)
        ]
        for request, prompt in zip(requests, preparing, strict=True):
            engine.submit(request, prompt.result(5), sink)
        for _ in range(200):
            if sum(isinstance(e, Finished) for e in events) == 3:
                break
            time.sleep(0.01)
        first = engine.backend.decodes[0]  # type: ignore[union-attr]
        assert {seq for _, _, seq, _ in first} == {0, 1, 2}


def test_a_lone_request_on_an_idle_engine_is_not_held_by_the_burst_window(monkeypatch):
    # Nothing else is on its way in: the first step starts at once, not after the window
    # (30 s here: the old rule held every first request for at least the window).
    monkeypatch.setattr(worker, "BURST_WINDOW_S", 30.0)
    monkeypatch.setattr(worker, "BURST_MOST_S", 30.0)
    with threaded_engine() as engine:
        done = threading.Event()
        request = GenerationRequest("aaa", SamplingParams(max_tokens=2, temperature=0))

        def put(event: object) -> None:
            if isinstance(event, Finished):
                done.set()

        engine.submit(request, engine.prepare(request), Sink(InlineLoop(), put))
        assert done.wait(10), "a lone request waited for the burst window"


def _first_step_of_a_burst(monkeypatch, quiet: float, most: float, prepare_s: float) -> set:
    """The sequences of an idle engine's first decode when one request is put while a second
    is still on a prepare thread for `prepare_s` seconds."""
    monkeypatch.setattr(worker, "BURST_WINDOW_S", quiet)
    monkeypatch.setattr(worker, "BURST_MOST_S", most)
    with threaded_engine() as engine:
        events: list = []
        sink = Sink(InlineLoop(), events.append)
        first, second = (
            GenerationRequest(prompt, SamplingParams(max_tokens=2, temperature=0))
            for prompt in ("aaa", "bbb")
        )

        def slow_prepare() -> Prompt:
            time.sleep(prepare_s)
            return engine.prepare(second)

        preparing = engine.on_prepare_thread(slow_prepare)
        engine.submit(first, engine.prepare(first), sink)
        engine.submit(second, preparing.result(5), sink)
        for _ in range(200):
            if sum(isinstance(e, Finished) for e in events) == 2:
                break
            time.sleep(0.01)
        return {seq for _, _, seq, _ in engine.backend.decodes[0]}  # type: ignore[union-attr]


def test_an_idle_engine_waits_for_a_request_still_being_prepared(monkeypatch):
    # The second request of a burst is rendered for 150 ms after the first reached the
    # inbox: the first step waits for it (a fixed 20 ms window would start without it).
    assert _first_step_of_a_burst(monkeypatch, quiet=0.02, most=2.0, prepare_s=0.15) == {0, 1}


def test_an_idle_engine_waits_for_a_burst_at_most_burst_most(monkeypatch):
    assert _first_step_of_a_burst(monkeypatch, quiet=0.02, most=0.05, prepare_s=0.6) == {0}


def test_the_engine_thread_waits_when_idle_after_a_cancel():
    with threaded_engine() as engine:
        events: list = []
        request = GenerationRequest(
            "go", SamplingParams(max_tokens=100000, temperature=0, logit_bias=NO_EOS)
        )
        job = engine.submit(request, engine.prepare(request), Sink(InlineLoop(), events.append))
        while engine.steps < 5:
            time.sleep(0.001)
        engine.cancel(job)
        time.sleep(0.05)
        before = engine.steps
        time.sleep(0.2)
        assert engine.steps == before, "the engine kept stepping with nothing to do"
        assert engine.stalled_for() == 0.0


def grammar_request(gbnf: str, max_tokens: int = 5) -> GenerationRequest:
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0, logit_bias=NO_EOS, grammar=GrammarSpec("gbnf", gbnf)
    )
    return GenerationRequest("constrained", params)


def submit_with_grammar(engine: Engine, gbnf: str, put, max_tokens: int = 5) -> Job:
    """Submit with a scripted grammar text (the real `prepare` would refuse it)."""
    request = grammar_request(gbnf, max_tokens)
    prompt = replace(engine.prepare(grammar_request("letters")), gbnf=gbnf)
    return engine.submit(request, prompt, Sink(InlineLoop(), put))


def test_a_slow_grammar_delays_only_its_own_answer():
    with threaded_engine(n_ctx=512) as engine:
        timeline: list = []
        slow: list = []

        def put_slow(event) -> None:
            slow.append(event)
            timeline.append(("slow", event))

        submit_with_grammar(engine, GRAMMAR_SLOW, put_slow, max_tokens=3)
        request = GenerationRequest(
            "free", SamplingParams(max_tokens=100, temperature=0, logit_bias=NO_EOS)
        )
        engine.submit(
            request,
            engine.prepare(request),
            Sink(InlineLoop(), lambda e: timeline.append(("fast", e))),
        )
        deadline = time.monotonic() + 10
        while not (finishes(slow) and any(isinstance(e, Finished) for _, e in timeline)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # Each grammar token takes 0.3 s; the free stream's 100 tokens all came meanwhile.
        first_slow = next(i for i, (who, _) in enumerate(timeline) if who == "slow")
        fast_done = next(i for i, (w, e) in enumerate(timeline) if isinstance(e, Finished))
        assert fast_done < first_slow
        assert finishes(slow) == {0: "length"} and answers(slow)[0].isalpha()


def staggered_rounds(engine: Engine, n: int, max_tokens: int) -> list[list]:
    """Run an n-choice request whose grammar samples take 10, 20, 30 ... ms (two grammar
    threads: a step's rows arrive up to ~60 ms apart for n = 4); the decodes after the prompt."""
    events: list = []
    request = replace(grammar_request(GRAMMAR_STAGGERED, max_tokens), n=n)
    prompt = replace(
        engine.prepare(replace(grammar_request("letters"), n=n)), gbnf=GRAMMAR_STAGGERED
    )
    engine.submit(request, prompt, Sink(InlineLoop(), events.append))
    deadline = time.monotonic() + 10
    while len(finishes(events)) < n:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert finishes(events) == dict.fromkeys(range(n), "length")
    decodes = engine.backend.decodes  # type: ignore[attr-defined]
    generation = [d for d in decodes if all(out for *_, out in d)]
    assert len(generation[0]) == 1  # the prompt's last token, sampled by every choice
    return generation[1:]


def test_a_step_s_grammar_samples_are_decoded_together(monkeypatch):
    # Steps the engine takes to cost 1 s: with nothing else to step, the thread waits up to a
    # whole step for the samples still in flight, so every token of the four choices comes
    # from one decode of four rows (stepping at the first arrival would split each round).
    monkeypatch.setattr(StepCost, "generation_seconds", lambda self, rows: 1.0)
    with threaded_engine(n_ctx=512) as engine:
        rounds = staggered_rounds(engine, n=4, max_tokens=5)
    assert [len(d) for d in rounds] == [4] * 4  # the first token of each came from the prompt


def test_without_a_timed_step_nothing_waits_for_samples(monkeypatch):
    # Before any step is timed the engine does not know what waiting saves: it steps as
    # samples arrive, and a round splits.
    monkeypatch.setattr(StepCost, "generation_seconds", lambda self, rows: None)
    with threaded_engine(n_ctx=512) as engine:
        rounds = staggered_rounds(engine, n=4, max_tokens=5)
    assert len(rounds) > 4 and sum(map(len, rounds)) == 4 * 4


def test_beside_other_work_the_wait_for_samples_is_a_share_of_a_step(monkeypatch):
    monkeypatch.setattr(StepCost, "generation_seconds", lambda self, rows: 0.2)
    h = Harness()
    events: list = []
    job = submit_with_grammar(h.engine, GRAMMAR_SLOW, events.append, max_tokens=3)
    h.step(2)
    assert job.lead.pending is not None and not job.lead.pending[0].done()
    gen = h.engine._ready().generating
    handed = gen._handed
    assert gen.gather_deadline() == pytest.approx(
        handed + generating.GATHER_SHARE_GRAMMAR_ONLY * 0.2
    )
    h.submit("free", max_tokens=4)  # a stream without a grammar: its next token would wait
    h.step()  # its prompt (the grammar's sample is still in flight)
    assert gen.gather_deadline() == pytest.approx(handed + generating.GATHER_SHARE * 0.2)
    assert generating.GATHER_SHARE <= 0.15
    h.run_until_idle(limit=5000)
    assert gen.gather_deadline() is None  # nothing in flight


def test_cancel_while_a_grammar_sample_is_in_flight():
    h = Harness()
    events: list = []
    job = submit_with_grammar(h.engine, GRAMMAR_SLOW, events.append, max_tokens=50)
    h.step(2)
    assert job.lead.pending is not None
    before_cancel = list(events)
    h.engine.cancel(job)
    h.step()
    assert job.state is JobState.CANCELLED and not h.scheduler.has_work()
    time.sleep(0.4)  # the sample in flight returns into a cancelled job
    h.step()
    assert events == before_cancel, "no text, Finished or fault may follow a cancel"
    h.assert_clean()


# ---- failures stay with their request -------------------------------------------------------


def test_a_sampler_that_cannot_be_made_fails_only_its_request():
    h = Harness()
    _, good = h.submit("fine", max_tokens=5)
    bad: list = []
    submit_with_grammar(h.engine, GRAMMAR_RAISES_ON_ADMIT, bad.append)
    h.run_until_idle()
    assert len(bad) == 1 and isinstance(bad[0], EngineFault)
    assert finishes(good) == {0: "length"}
    h.assert_clean()


@pytest.mark.parametrize("where", ["engine thread", "grammar thread"])
def test_a_sampling_exception_fails_only_its_request(where):
    h = Harness()
    _, good = h.submit("fine", max_tokens=5, n=2, temperature=1.0)
    if where == "grammar thread":
        bad: list = []
        submit_with_grammar(h.engine, GRAMMAR_RAISES_ON_SAMPLE, bad.append)
    else:
        _, bad = h.submit("bad", temperature=1.0, seed=SEED_RAISES)
    h.run_until_idle()
    assert isinstance(bad[-1], EngineFault)
    assert finishes(good) == {0: "length", 1: "length"}
    h.assert_clean()


def test_a_scoring_failure_fails_only_its_request():
    h = Harness()
    _, good = h.submit("fine", max_tokens=5)
    h.backend.fail_score = True
    _, bad = h.score("text")
    h.run_until_idle()
    assert len(bad) == 1 and isinstance(bad[0], EngineFault)
    assert finishes(good) == {0: "length"}
    h.backend.fail_score = False
    _, again = h.score("text")
    h.run_until_idle()
    assert isinstance(again[0], ScoreResult)
    h.assert_clean()


def test_a_broken_decode_restarts_the_context_and_queued_requests_still_run():
    h = Harness(parallel=1)
    _, running = h.submit("first", max_tokens=10)
    _, queued = h.submit("second", max_tokens=4)
    h.step(3)
    h.backend.before_decode = lambda batch: -3 if len(h.backend.decodes) == 4 else None
    h.run_until_idle()
    assert isinstance(running[-1], EngineRestarted)
    assert h.engine.stats().engine_restarts == 1 and h.backend.resets == 1
    assert finishes(queued) == {0: "length"}
    assert answers(queued) == fresh_answer("second", max_tokens=4)
    h.assert_clean(restarts=1)


def checks_by_decode(monkeypatch: pytest.MonkeyPatch, h: Harness) -> list[int]:
    """The number of decodes made before each invariant check the engine runs from now on."""
    checks: list[int] = []
    check = Scheduler.check_invariants

    def counted(scheduler: Scheduler) -> None:
        checks.append(len(h.backend.decodes))
        check(scheduler)

    monkeypatch.setattr(Scheduler, "check_invariants", counted)
    return checks


def until_generating(h: Harness, job: Job) -> None:
    """Step until `job` is past its prompt."""
    while job.state is not JobState.GENERATING:
        h.step()


def test_an_invariant_that_fails_restarts_instead_of_corrupting(monkeypatch):
    """A break in the bookkeeping of a stream's plain steps (its reservations no longer add
    up; the decodes do not notice) restarts the context within CHECK_EVERY_ROUTINE steps."""
    h = Harness(draft_max=0)
    checks = checks_by_decode(monkeypatch, h)
    job, events = h.submit("x", max_tokens=50)
    until_generating(h, job)
    h.scheduler.reserved += 1
    with pytest.raises(InvariantError):
        h.scheduler.check_invariants()
    del checks[:]
    for _ in range(stepper_module.CHECK_EVERY_ROUTINE):
        h.step()
        if checks:
            break
    assert len(checks) == 1
    assert isinstance(events[-1], EngineRestarted) and h.engine.stats().engine_restarts == 1


def test_routine_steps_check_the_invariants_once_in_a_few_and_other_steps_every_time(
    monkeypatch,
):
    """A stream's steps that only add its next token check the invariants once in
    CHECK_EVERY_ROUTINE; a step that takes in, admits, cancels or ends a job, decodes a
    prompt or cuts a draft checks them after its decode (and before it when a job came in)."""
    every = stepper_module.CHECK_EVERY_ROUTINE
    h = Harness(draft_max=0)
    checks = checks_by_decode(monkeypatch, h)
    job, _ = h.submit("a prompt", max_tokens=200)
    h.step()
    assert checks == [0, 1]  # taken in: before and after the decode
    until_generating(h, job)
    assert checks[-1] == len(h.backend.decodes)  # the prompt's steps all checked
    del checks[:]
    start = len(h.backend.decodes)
    h.step(3 * every)
    assert checks == [start + every, start + 2 * every, start + 3 * every]
    short, _ = h.submit("b", max_tokens=3)
    h.step()
    decodes = len(h.backend.decodes)
    assert checks[-2:] == [decodes - 1, decodes]
    while short.state is not JobState.DONE:
        h.step()
    assert checks[-1] == len(h.backend.decodes)  # the step it ended in
    h.engine.cancel(job)
    h.step()
    assert h.scheduler.live_jobs() == [] and checks[-1] == len(h.backend.decodes)
    h.assert_clean()


# ---- preparation ----------------------------------------------------------------------------


def test_a_prompt_too_long_by_its_size_alone_is_refused_without_tokenizing():
    h = Harness(n_ctx=64)
    request = GenerationRequest("w" * 10_000, SamplingParams())
    with pytest.raises(PromptTooLong) as info:
        h.engine.prepare(request)
    assert info.value.at_least and h.backend.tokenized_bytes == 0
    chat = GenerationRequest(
        ChatPrompt(tuple(ChatTurn("user", "m") for _ in range(1000))), SamplingParams()
    )
    with pytest.raises(PromptTooLong):
        h.engine.prepare(chat)
    assert h.backend.tokenized_bytes == 0


def test_a_grammar_is_checked_before_submission():
    h = Harness()
    request = GenerationRequest("x", SamplingParams(grammar=GrammarSpec("gbnf", "unparsable")))
    with pytest.raises(InvalidPrompt):
        h.engine.prepare(request)


def letters(text: str) -> tuple[int, ...]:
    return tuple(FIRST_LETTER + ord(c) - ord("a") for c in text)


def test_a_token_prompt_is_decoded_exactly_as_given():
    """No BOS is added: the ids with the BOS written out answer as the text does."""
    h = Harness()
    job, events = h.submit(TokenPrompt((BOS, *letters("hello"))))
    h.run_until_idle()
    assert h.backend.decodes[0][0][0] == BOS and job.prompt.tokens[0] == BOS
    _, text_events = h.submit("hello")
    h.run_until_idle()
    assert answers(events) == answers(text_events)
    bare, _ = h.submit(TokenPrompt(letters("hello")))
    assert bare.prompt.tokens == list(letters("hello"))
    h.run_until_idle()
    h.assert_clean()


def test_token_ids_outside_the_vocabulary_are_refused_before_submission():
    h = Harness()
    with pytest.raises(UnknownToken) as info:
        h.engine.prepare(GenerationRequest(TokenPrompt((BOS, VOCAB)), SamplingParams()))
    assert (info.value.position, info.value.token, info.value.index) == (1, VOCAB, None)
    request = ScoreRequest(texts=("ok", TokenPrompt((-1,))))
    with pytest.raises(UnknownToken) as info:
        h.engine.prepare_score(request)
    assert (info.value.position, info.value.token, info.value.index) == (0, -1, 1)
    with pytest.raises(UnknownToken):
        h.engine.detokenize((BOS, VOCAB + 5), special=True)
    assert h.engine.detokenize((BOS, *letters("hi")), special=True) == "<bos>hi"
    assert h.engine.detokenize((BOS, *letters("hi")), special=False) == "hi"


def test_scored_tokens_are_described_one_per_own_token():
    """A BOS the model adds is not described; a token prompt's first token is, with no value
    (nothing predicts it); the values are the plain scores'."""
    h = Harness()
    _, events = h.score("abc", TokenPrompt(letters("abc")), TokenPrompt(letters("z")), top=2)
    h.run_until_idle()
    [result] = events
    text, ids, single = result.tokens
    assert [(t.index, t.token) for t in text] == [(1, b"a"), (2, b"b"), (3, b"c")]
    assert all(t.logprob is not None and len(t.top) == 2 for t in text)
    assert ids[0] == TokenLogprob(0, b"a", None)
    assert [(t.index, t.token) for t in ids[1:]] == [(1, b"b"), (2, b"c")]
    assert single == (TokenLogprob(0, b"z", None),)
    _, plain = h.score("abc", TokenPrompt(letters("abc")), TokenPrompt(letters("z")))
    h.run_until_idle()
    assert plain[0].scores == (
        pytest.approx(sum(t.logprob for t in text) / 3),
        pytest.approx(sum(t.logprob for t in ids[1:]) / 2),
        0.0,
    )
    h.assert_clean()


def test_without_bos_a_texts_first_token_is_described_with_no_value():
    h = Harness()
    h.backend.add_bos = False
    _, events = h.score("abc", top=0)
    h.run_until_idle()
    [text] = events[0].tokens
    assert text[0] == TokenLogprob(0, b"a", None)
    assert [(t.index, t.token) for t in text[1:]] == [(1, b"b"), (2, b"c")]
    h.assert_clean()


def hold_rendering(backend: FakeBackend) -> threading.Event:
    """Make the backend's chat rendering wait until the returned event is set."""
    gate = threading.Event()
    render = backend.render

    def held(prompt):
        gate.wait(5)
        return render(prompt)

    backend.render = held  # type: ignore[method-assign]
    return gate


def test_the_queue_limit_counts_requests_being_prepared():
    h = Harness(max_queue=2)
    gate = hold_rendering(h.backend)
    chat = GenerationRequest(ChatPrompt((ChatTurn("user", "hi"),)), SamplingParams())
    futures = [h.engine.prepare_async(chat) for _ in range(2)]
    assert h.engine.stats().queue_length == 2
    with pytest.raises(Exception) as info:
        h.engine.prepare_async(chat)
    assert type(info.value).__name__ == "EngineOverloaded"
    gate.set()
    for future in futures:
        assert len(future.result(5).tokens) > 0
    assert h.engine.stats().queue_length == 0
    h.engine.close()


def test_a_request_cancelled_before_its_preparation_ran_frees_its_queue_place():
    h = Harness(max_queue=3)
    gate = hold_rendering(h.backend)
    chat = GenerationRequest(ChatPrompt((ChatTurn("user", "hi"),)), SamplingParams())
    busy = [h.engine.prepare_async(chat) for _ in range(worker.PREPARE_THREADS)]
    waiting = h.engine.prepare_async(chat)  # no prepare thread is free: it waits in the pool
    assert h.engine.stats().queue_length == worker.PREPARE_THREADS + 1
    assert waiting.cancel()  # its client went away
    assert h.engine.stats().queue_length == worker.PREPARE_THREADS
    gate.set()
    for future in busy:
        future.result(5)
    assert h.engine.stats().queue_length == 0
    h.engine.close()


def test_score_context_is_released_after_idle(monkeypatch):
    monkeypatch.setattr(worker, "SCORE_CONTEXT_IDLE_S", 0.0)
    h = Harness()
    _, events = h.score("abc def")
    h.run_until_idle()
    assert isinstance(events[0], ScoreResult) and h.backend.holds_score_context
    h.engine.housekeeping()
    assert not h.backend.holds_score_context


def test_steps_that_change_no_job_publish_their_figures_every_so_often(
    monkeypatch: pytest.MonkeyPatch,
):
    """The figures (`Engine.stats`) are published by every step that takes in, admits, ends
    or cancels a job and by one after which the engine is idle; the steps of a running
    stream publish them PUBLISH_EVERY_S apart."""
    h = Harness()
    now = [100.0]
    monkeypatch.setattr(StepClock, "now", lambda self: now[0])
    job, _ = h.submit("a prompt", max_tokens=40)
    h.step()  # takes the job in: published
    steps = h.engine.stats().engine_steps
    assert steps == len(h.backend.decodes) > 0
    for _ in range(5):  # the stream's steps, no time passing: not published
        h.step()
        assert h.engine.stats().engine_steps == steps
    now[0] += stepper_module.PUBLISH_EVERY_S
    h.step()
    assert h.engine.stats().engine_steps == len(h.backend.decodes) == steps + 6
    h.engine.cancel(job)
    h.step()  # a cancel: published at once, the engine idle
    assert h.engine.stats().engine_steps == len(h.backend.decodes)
    assert h.engine.stats().busy_slots == 0
    second, _ = h.submit("another prompt", max_tokens=2)
    h.run_until_idle()  # ends the job and goes idle: published
    assert second.state is JobState.DONE
    assert h.engine.stats().engine_steps == len(h.backend.decodes)


# ---- delivery to the event loops ------------------------------------------------------------


class GpuHarness(Harness):
    gpu = True


def stream_on(h: Harness, handler: Handler, max_tokens: int) -> Job:
    """A request whose events go to `handler`, on a real loop in its own thread."""
    request = GenerationRequest(
        prompt="hello there",
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0, logit_bias=NO_EOS),
    )
    return h.engine.submit(request, h.engine.prepare(request), handler.sink)


def texts_taken(handler: Handler) -> int:
    return sum(isinstance(event, TextDelta) for event in handler.taken)


def test_on_the_cpu_each_decode_waits_until_the_loop_has_taken_the_last_steps_tokens(
    loop_thread,
):
    """llama.cpp's threads take every core during a CPU decode; a loop sending tokens beside
    them stalls their barriers, so the loop's turn comes between decodes."""
    h = Harness(parallel=1)
    (handler,) = handlers(loop_thread, 1)
    job = stream_on(h, handler, max_tokens=12)
    seen: list[tuple[int, int]] = []  # (tokens generated, tokens the handler had taken)
    h.backend.before_decode = lambda batch: seen.append(
        (job.choices[0].n_gen if job.choices else 0, texts_taken(handler))
    )
    h.run_until_idle()
    assert [generated for generated, _ in seen][-3:] == [9, 10, 11]
    assert all(taken == generated for generated, taken in seen), seen
    assert dict(h.engine.stats().phase_seconds)["loops"] > 0
    h.assert_clean()


def test_on_a_gpu_and_with_a_held_loop_decodes_do_not_wait(loop_thread, monkeypatch):
    """On a GPU the loop sends beside the decode, never waited for; on the CPU a loop busy
    elsewhere is waited for LOOP_WAIT_S a step at most."""
    monkeypatch.setattr(stepper_module, "LOOP_WAIT_S", 0.001)
    made = handlers(loop_thread, 2)
    free = threading.Event()
    loop_thread.call_soon_threadsafe(free.wait, 10)  # the loop is held until the test ends
    for harness, handler in zip((GpuHarness, Harness), made, strict=True):
        h = harness(parallel=1)
        job = stream_on(h, handler, max_tokens=6)
        h.run_until_idle()
        assert job.state is JobState.DONE and handler.taken == []
        assert (dict(h.engine.stats().phase_seconds)["loops"] > 0) == (not harness.gpu)
        h.assert_clean()
    free.set()


# ---- the model outlives every thread that uses it -------------------------------------------


@pytest.mark.parametrize("ending", ["closed", "crashed"])
def test_the_model_is_freed_only_after_the_prepare_threads_are_done_with_it(monkeypatch, ending):
    """A prepare thread tokenizes with the model. When the engine thread ends (the server
    closes it, or a bug outside any one job crashes it) the model is freed only once no
    prepare runs: llama.cpp tokenizing with a freed model reads freed memory."""
    tokenize = FakeBackend.tokenize
    inside, let_go = threading.Event(), threading.Event()
    tokenizing: list[int] = []  # prepares inside tokenize
    closed_with: list[int] = []  # how many were inside when the model was freed

    def slow_tokenize(self: FakeBackend, text: str, **flags: bool) -> list[int]:
        tokenizing.append(1)
        inside.set()
        let_go.wait(10)
        tokenizing.pop()
        return tokenize(self, text, **flags)

    def crash(self: stepper_module.Stepper) -> None:
        raise RuntimeError("a bug outside any one job")

    monkeypatch.setattr(FakeBackend, "tokenize", slow_tokenize)
    monkeypatch.setattr(FakeBackend, "close", lambda self: closed_with.append(len(tokenizing)))
    with threaded_engine() as engine:
        preparing = engine.prepare_async(GenerationRequest("slow", SamplingParams(max_tokens=2)))
        assert inside.wait(5)
        if ending == "crashed":
            monkeypatch.setattr(stepper_module.Stepper, "step", crash)
            request = GenerationRequest(TokenPrompt((BOS, FIRST_LETTER)), SamplingParams())
            events: list = []
            engine.submit(request, engine.prepare(request), Sink(InlineLoop(), events.append))
            for _ in range(500):  # the crash fails the job just before the model is freed
                if events:
                    break
                time.sleep(0.01)
            assert isinstance(events[0], EngineFault)
            time.sleep(0.2)  # the model was freed by now, had the thread not waited
            assert closed_with == []
            let_go.set()
        else:
            threading.Timer(0.2, let_go.set).start()
    assert closed_with == [0]
    assert preparing.done()
