"""A generation step on the engine thread: decode the plan's batch, sample or verify each
row, and account for every token (end of generation, stop strings, limits, log-probs).

Grammar-constrained sampling runs on grammar threads from a copy of the logit row (see
llama/sampling.py): the choice sits out the steps until its token arrives (`collect`), and the
other streams go on, so a slow grammar delays only its own answer. The engine thread waits for
samples still in flight for at most GATHER_SHARE of a step before it steps without them
(`gather_deadline`): the rows of one step's grammar answers (n > 1, several structured
requests at once) arrive a few milliseconds apart, and a step taken at the first arrival
would split every round into two or more steps that each cost nearly a full one on a CPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from edgeserve.engine.draft_sizing import DRAFT_SHARE
from edgeserve.engine.jobs import Choice, Job, Pending
from edgeserve.engine.loaded import Loaded
from edgeserve.engine.planning import GenerationPlan, MediaPlan
from edgeserve.engine.types import Finished, FinishReason, TextDelta

log = logging.getLogger("edgeserve.engine")

# The most the engine thread waits for a step's detached samples still in flight, as a share of
# the step they would join (its expected cost). Beside other work (a stream without a grammar,
# a prompt, a score): the share by which drafts may lengthen a stream's gap (DRAFT_SHARE),
# one bound on how much longer any stream's next token may wait. With only grammar answers to
# step: a whole step, since a step taken without the late rows costs nearly what one with them
# does, and the late rows would wait that step out (SmolLM2's and Gemma's grammar samples take
# 2-15 ms each on 2 threads).
GATHER_SHARE = DRAFT_SHARE
GATHER_SHARE_GRAMMAR_ONLY = 1.0


class Generating:
    """Runs generation plans and keeps each choice's tokens and text."""

    def __init__(self, state: Loaded, grammar: Executor, wake: Callable[[object], None]) -> None:
        self.state = state
        self.backend = state.backend
        self.scheduler = state.scheduler
        self._grammar = grammar
        self._wake = wake
        self._handed = 0.0  # time.monotonic() when a detached sample was last handed off

    def open_choices(self, job: Job, seqs: list[int]) -> list[Choice]:
        """The choices of a job being admitted: one sampler per sequence."""
        params = job.request.params
        job.admitted_at = time.perf_counter()
        choices: list[Choice] = []
        try:
            for index, seq in enumerate(seqs):
                sampler = self.backend.new_sampler(params, index, job.prompt.gbnf)
                choices.append(Choice(index=index, seq_id=seq, sampler=sampler, stops=params.stop))
        except BaseException:
            for choice in choices:
                choice.sampler.free()
            raise
        return choices

    def run(self, plan: GenerationPlan) -> str | None:
        """Decode the plan and take in its rows; why the context must be made anew, if it
        must (a decode that raised or returned anything but 0 or 1)."""
        started = time.perf_counter()
        rc = self._decode(self.backend.decode)
        self.state.clock.lap("decode")
        if rc == 1:
            return None
        if rc != 0:
            return f"llama_decode returned {rc}"
        self.scheduler.planner.step_cost.record(
            plan.logit_rows + plan.ending_prompts, time.perf_counter() - started, plan.prompt_tokens
        )
        rows = self.scheduler.commit(plan)
        self.state.clock.lap("plan")
        read = time.perf_counter()
        for row, job, choice, draft in rows:
            if job.prefilled_at is None:
                job.prefilled_at = read
            if job.state.ended or choice.done:
                continue
            try:
                if draft:
                    self._verify(job, choice, row, draft)
                else:
                    self._sample(job, choice, row)
            except Exception as exc:
                self.state.fail(job, exc)
        return None

    def run_media(self, plan: MediaPlan) -> str | None:
        """Decode the plan's media item into its job's sequence; why the context must be
        made anew, if it must."""
        span = plan.span
        seq = plan.job.lead.seq_id
        rc = self._decode(
            lambda: self.backend.decode_media(seq, span.start, span.embeddings, span.non_causal)
        )
        self.state.clock.lap("decode")
        if rc == 1:
            return None
        if rc != 0:
            return f"llama_decode (media) returned {rc}"
        self.scheduler.commit_media(plan)
        return None

    def _decode(self, decode: Callable[[], int]) -> int | str:
        """Run a decode and count the step; with no room in the KV cache (1), free some."""
        try:
            rc: int | str = decode()
        except Exception as exc:
            log.exception("llama_decode raised")
            rc = f"an exception ({exc})"
        self.state.tally.steps += 1
        if rc == 1:
            self._relieve_kv()
        return rc

    def _verify(self, job: Job, choice: Choice, row: int, draft: tuple[int, ...]) -> None:
        """Sample row `row` and the draft's rows after it in order, keeping each drafted token
        only while it is the token sampled before it (speculation.py): the answer is the one
        of sampling one row per step. Cells of rejected drafts go."""
        drafter = choice.drafter
        assert drafter is not None, "the scheduler drafts only for a choice with a drafter"
        tally = self.state.tally
        drafter.drafted += len(draft)
        tally.drafted += len(draft)
        accepted = 0
        for offset in range(len(draft) + 1):
            if offset:
                choice.n_past += 1  # the drafted token before this row is the answer's
            token = choice.sampler.sample(row + offset)
            kept = offset < len(draft) and token == draft[offset]
            if kept:
                accepted += 1
                drafter.accepted += 1
                tally.draft_accepted += 1
            self._on_sampled(job, choice, token, row + offset)
            if choice.done or not kept:
                break
        if not choice.done:
            self.scheduler.keep(choice, len(draft), accepted)

    def _sample(self, job: Job, choice: Choice, row: int) -> None:
        """Sample output row `row` for `choice`: here, or (a grammar) on a grammar thread from
        a copy of the row, the choice sitting out the steps until its token arrives."""
        sampler = choice.sampler
        if not sampler.detached:
            self._on_sampled(job, choice, sampler.sample(row), row)
            return
        logits = self.backend.logit_row(row).copy()
        future = self._grammar.submit(sampler.sample_logits, logits)
        choice.pending = (future, logits)
        self._handed = time.monotonic()
        future.add_done_callback(self._wake)

    def _on_sampled(self, job: Job, choice: Choice, token: int | None, row: int) -> None:
        """`_on_token` for a token sampled in place from batch row `row` (read for log-probs
        when asked)."""
        clock = self.state.clock
        clock.lap("sample")
        wanted = job.request.params.logprobs is not None
        self._on_token(job, choice, token, self.backend.logit_row(row) if wanted else None)
        clock.lap("account")

    def in_flight(self) -> bool:
        """True while a detached sample is still on a grammar thread."""
        return any(
            (pending := choice.pending) is not None and not pending[0].done()
            for job in self.scheduler.active
            for choice in job.choices
        )

    def gather_deadline(self) -> float | None:
        """Until when (time.monotonic) the thread may wait for the detached samples still in
        flight before its next step: GATHER_SHARE of that step's expected cost after the last
        was handed off, GATHER_SHARE_GRAMMAR_ONLY when nothing else would step. None when none
        is in flight or no step has been timed yet."""
        if not self.in_flight():
            return None
        rows = sum(not choice.done for job in self.scheduler.active for choice in job.choices)
        step = self.scheduler.planner.step_cost.generation_seconds(max(1, rows))
        if step is None:
            return None
        share = GATHER_SHARE if self.scheduler.has_work() else GATHER_SHARE_GRAMMAR_ONLY
        return self._handed + share * step

    def arrived(self) -> bool:
        """True when a detached sample has arrived (there is work for the thread)."""
        return bool(self._arrivals())

    def _arrivals(self) -> list[tuple[Job, Choice, Pending]]:
        """The choices whose detached sample has arrived, each with its sample in flight."""
        return [
            (job, choice, pending)
            for job in self.scheduler.active
            for choice in job.choices
            if (pending := choice.pending) is not None and pending[0].done()
        ]

    def collect(self) -> None:
        """Account for the detached samples that have arrived."""
        for job, choice, (future, logits) in self._arrivals():
            choice.pending = None
            if job.state.ended or choice.done:
                continue
            try:
                self._on_token(job, choice, future.result(), logits)
            except Exception as exc:
                self.state.fail(job, exc)

    def _relieve_kv(self) -> None:
        outcome = self.scheduler.relieve_kv()
        if isinstance(outcome, tuple):
            job, choice = outcome
            log.warning("KV cache full: ending request %d choice %d early", job.rid, choice.index)
            self._finish(job, choice, "length")
        elif outcome is not None:
            log.warning("KV cache full: request %d goes back to the queue", outcome.rid)

    def _on_token(
        self, job: Job, choice: Choice, token: int | None, logits: np.ndarray | None
    ) -> None:
        """Account for a sampled token (`logits`: the row it came from, when log-probs are
        asked): end of generation, stop string, limits, or go on."""
        backend = self.backend
        if token is None:  # the grammar allows nothing more
            self._finish(job, choice, "stop")
            return
        choice.n_gen += 1
        choice.generated.append(token)
        top_n = job.request.params.logprobs
        if top_n is not None and logits is not None:
            detail = self.state.softmax.describe(logits, choice.index, token, top_n, backend.piece)
            self.state.emit(job, detail)
        if backend.is_eog(token):
            self._finish(job, choice, "stop")
            return
        text, hit = choice.push_text(backend.piece(token))
        self._emit_text(job, choice, text)
        if hit is not None:
            self._finish(job, choice, "stop", drain=False, stop_sequence=hit)
        elif choice.sampler.slow:
            log.warning(
                "request %d choice %d: a grammar step took over %g s; answer ended early",
                job.rid,
                choice.index,
                choice.sampler.step_limit_s,
            )
            self._finish(job, choice, "length")
        elif choice.n_gen >= job.prompt.max_new or choice.n_past >= backend.n_ctx:
            self._finish(job, choice, "length")
        else:
            choice.last_token = token

    def _emit_text(self, job: Job, choice: Choice, text: str) -> None:
        if text:
            self.state.emit(job, TextDelta(choice.index, text, choice.n_gen, job.cached))

    def _finish(
        self,
        job: Job,
        choice: Choice,
        reason: FinishReason,
        *,
        drain: bool = True,
        stop_sequence: str | None = None,
    ) -> None:
        """End a choice: release held-back text, report it, free its sequence."""
        if drain:
            self._emit_text(job, choice, choice.drain_text())
        drafter = choice.drafter
        now = time.perf_counter()
        read = now if job.prefilled_at is None else job.prefilled_at
        finished = Finished(
            choice.index,
            reason,
            choice.n_gen,
            job.cached,
            stop_sequence,
            drafter.drafted if drafter else 0,
            drafter.accepted if drafter else 0,
            prompt_s=max(0.0, read - job.admitted_at) if job.admitted_at else 0.0,
            decode_s=now - read,
        )
        self.state.emit(job, finished)
        self.scheduler.finish(job, choice)
