"""One scheduling step on the engine thread: take in new requests and cancels, admit, decode
once (a generation, score or embeddings plan), check the scheduler's invariants, deliver.

Isolation: any exception while serving one job (sampling, a grammar, a score chunk, making
its samplers) ends that job alone with EngineFault (500, logged with its traceback); the
others go on. A decode that breaks the context (any status but 0 or 1) or a scheduler
invariant that stops holding makes the context anew: the running jobs get EngineRestarted
(503, retry), the waiting ones stay queued, and the process keeps serving.
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor

from edgeserve.engine.generating import Generating
from edgeserve.engine.inbox import Inbox
from edgeserve.engine.jobs import AnyJob
from edgeserve.engine.loaded import Loaded
from edgeserve.engine.planning import EmbedPlan, MediaPlan, ScorePlan
from edgeserve.engine.policy import InvariantError
from edgeserve.engine.ports import Backend
from edgeserve.engine.score_steps import ScoreSteps
from edgeserve.engine.types import EngineConfig, EngineStats
from edgeserve.errors import EngineError, EngineRestarted

log = logging.getLogger("edgeserve.engine")


class Stepper:
    """The loaded engine's steps (engine thread only); `snapshot` is what they last published
    for `Engine.stats` (read lock-free from any thread)."""

    def __init__(
        self, backend: Backend, config: EngineConfig, inbox: Inbox, grammar: Executor
    ) -> None:
        self.config = config
        self.state = Loaded(backend, config)
        self.inbox = inbox
        self.generating = Generating(self.state, grammar, inbox.wake)
        self.scoring = ScoreSteps(self.state)
        self.snapshot = self._stats()

    def has_work(self) -> bool:
        """True when a step would do something (a decode, or an arrived detached sample)."""
        return self.state.scheduler.has_work() or self.generating.arrived()

    def idle(self) -> bool:
        """True when no job is live (queued, running or scoring)."""
        return not self.state.scheduler.live_jobs()

    def step(self) -> None:
        """One step (see the module docstring). Never blocks."""
        state = self.state
        scheduler = state.scheduler
        jobs, cancels = self.inbox.take()
        for job in jobs:
            scheduler.enqueue(job)
        for job in cancels:
            scheduler.cancel(job)
        self.generating.collect()
        for job, exc in scheduler.admit(self.generating.open_choices):
            state.fail(job, exc)
        # Checked before the decode too: a reused prefix must be whole before anything
        # attends to it.
        broken = self._broken_invariant()
        plan = None if broken else scheduler.plan(state.backend.batch)
        if isinstance(plan, ScorePlan):
            self.scoring.score(plan)
        elif isinstance(plan, EmbedPlan):
            self.scoring.embed(plan)
        elif isinstance(plan, MediaPlan):
            broken = self.generating.run_media(plan) or self._broken_invariant()
        elif plan is not None:
            broken = self.generating.run(plan) or self._broken_invariant()
        if broken is not None:
            self.restart(broken)
        self.inbox.set_queued(len(scheduler.waiting))
        self._deliver()

    def _broken_invariant(self) -> str | None:
        """Why the scheduler's bookkeeping is broken (see Scheduler.check_invariants), or None."""
        try:
            self.state.scheduler.check_invariants()
        except InvariantError as exc:
            return f"a scheduler invariant failed ({exc})"
        return None

    def restart(self, why: str) -> None:
        """Make the generation context anew: running jobs get EngineRestarted, queued ones
        stay. Raises (ending the thread) only when no new context can be made."""
        state = self.state
        state.tally.restarts += 1
        log.error("restarting the engine's context: %s", why)
        ended = state.scheduler.reset()
        state.backend.reset()
        for job in ended:
            state.emit(job, EngineRestarted("the engine restarted after an internal error"))

    def fail_all(self, exc: EngineError) -> None:
        """End every job, the inbox's included, with `exc`; the thread is ending."""
        scheduler = self.state.scheduler
        leftovers: list[AnyJob] = self.inbox.close()
        live = scheduler.live_jobs()
        for job in live:
            scheduler.cancel(job)
        for job in leftovers + live:
            self.state.emit(job, exc)
        self._deliver()

    def _deliver(self) -> None:
        self.snapshot = self._stats()
        self.state.outbox.flush()

    def _stats(self) -> EngineStats:
        """The thread's side of `EngineStats` (the queue and draining are the inbox's)."""
        backend, scheduler, tally = self.state.backend, self.state.scheduler, self.state.tally
        cost = scheduler.planner.step_cost
        return EngineStats(
            loaded=True,
            n_ctx=backend.n_ctx,
            parallel=self.config.parallel,
            busy_slots=scheduler.n_seq - len(scheduler.slots),
            queue_length=0,
            gpu_offload=backend.gpu_offload,
            n_gpu_layers=backend.n_gpu_layers,
            scoring_jobs=len(scheduler.scoring),
            kv_cells_used=backend.cells_used(),
            prefix_cache_hits=scheduler.prefix_hits,
            prefix_cached_tokens=scheduler.prefix_tokens,
            prefix_cache_cells=scheduler.cached_cells(),
            engine_steps=tally.steps,
            engine_restarts=tally.restarts,
            draft_tokens=tally.drafted,
            draft_accepted_tokens=tally.draft_accepted,
            draft_model=self.config.draft_model_path,
            step_fixed_seconds=cost.fixed_seconds(),
            step_row_seconds=cost.row_seconds(),
            step_prompt_token_seconds=cost.token_seconds() or 0.0,
        )
