"""One scheduling step on the engine thread: take in new requests, cancels and calls (loading
and unloading LoRA adapters), admit, decode once (a generation, score or embeddings plan,
under its adapter set), check the scheduler's invariants, deliver.

The invariants (invariants.py) are checked after every step, and before its decode too when
jobs came in (a reused prefix must be whole before anything attends to it), but after a
routine step only once in CHECK_EVERY_ROUTINE: a step that gave each running choice one more
token, while no job came in, was admitted or ended and no sequence lost cells, runs the same
bookkeeping as the step before it.

Isolation: any exception while serving one job (sampling, a grammar, a score chunk, making
its samplers) ends that job alone with EngineFault (500, logged with its traceback); the
others go on. A decode that breaks the context (any status but 0 or 1) or a scheduler
invariant that stops holding makes the context anew: the running jobs get EngineRestarted
(503, retry), the waiting ones stay queued, and the process keeps serving.
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor

from edgeserve.engine.adapters import Adapter, AdapterCatalog, RuntimeLoading
from edgeserve.engine.delivery import wait_for
from edgeserve.engine.generating import Generating
from edgeserve.engine.inbox import Inbox
from edgeserve.engine.invariants import InvariantError
from edgeserve.engine.jobs import AnyJob
from edgeserve.engine.loaded import Loaded
from edgeserve.engine.planning import EmbedPlan, GenerationPlan, MediaPlan, ScorePlan
from edgeserve.engine.ports import Backend
from edgeserve.engine.score_steps import ScoreSteps
from edgeserve.engine.step_cost import CALIBRATION_ROWS
from edgeserve.engine.types import EngineConfig, EngineStats
from edgeserve.errors import (
    AdapterInUse,
    AdapterRefused,
    EngineError,
    EngineRestarted,
    InvalidAdapter,
    UnknownAdapter,
)

log = logging.getLogger("edgeserve.engine")

# How often steps that change no job's state publish their figures (`Stepper.snapshot`): a
# step after which a different number of jobs wait, run or score (one came in, was admitted,
# ended or was cancelled), or after which the engine is idle, publishes at once. Building
# them every step cost ~30 µs of each step of a stream; every third step (50 ms apart on
# SmolLM2 on 2 cores) still ~10.
PUBLISH_EVERY_S = 0.25
# The longest a step on the CPU waits for the event loops to send its events before the next
# decode (a loop busy elsewhere then works beside it). `make bench` on 2 cores: 0.44 ms a
# step at one sampled SmolLM2 stream, 1.13 at eight.
LOOP_WAIT_S = 0.005
# One routine step in this many checks the invariants (see the module docstring): the check
# cost ~30 µs of each step of a stream, about as much as a whole step's planning.
CHECK_EVERY_ROUTINE = 8


class Stepper:
    """The loaded engine's steps (engine thread only); `snapshot` is what they last published
    for `Engine.stats` (read lock-free from any thread)."""

    def __init__(
        self,
        backend: Backend,
        config: EngineConfig,
        inbox: Inbox,
        grammar: Executor,
        adapters: AdapterCatalog,
    ) -> None:
        self.config = config
        self.adapters = adapters
        self.runtime_loading = RuntimeLoading.of(config)
        self.state = Loaded(backend, config)
        if config.draft_max > 0 and not backend.is_classifier:
            cost = self.state.scheduler.planner.step_cost
            cost.calibrate(backend.time_steps(CALIBRATION_ROWS))
        self.inbox = inbox
        self.generating = Generating(self.state, grammar, inbox.wake)
        self.scoring = ScoreSteps(self.state)
        # When a step's events leave for the event loops. With the model on a GPU the CPU is
        # free while llama_decode runs, so they leave just before the next decode and the
        # loops render and send them meanwhile (the GPU is not kept waiting for them). On
        # the CPU, llama.cpp's threads take every core during a decode, and a loop working
        # beside them stalls their barriers, so they leave at the end of the step and the
        # next decode waits (at most LOOP_WAIT_S) until the loops have sent them.
        self._deliver_during_decode = backend.gpu_offload
        self.snapshot = self._stats()
        self._live = (0, 0, 0)  # the queued, running and scoring jobs at the last publish
        self._due = 0.0  # when (the step clock's time) a running step publishes again
        self._shape = (0, 0, 0, 0)  # the live jobs and the scheduler's cuts after the last step
        self._routine = 0  # routine steps since the invariants were last checked
        self._queued = 0  # the scheduler's queue as last told to the inbox

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
        clock = state.clock
        clock.begin()
        jobs, cancels, calls = self.inbox.take()
        for job in jobs:
            scheduler.enqueue(job)
            gone = [i for i, _ in job.request.adapters if self.adapters.with_id(i) is None]
            if gone:
                state.fail(job, UnknownAdapter(f"with id {gone[0]}"))
        for job in cancels:
            scheduler.cancel(job)
        for fn, future in calls:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except Exception as exc:
                    future.set_exception(exc)
        self.generating.collect()
        for job, exc in scheduler.admit(self.generating.open_choices):
            state.fail(job, exc)
        clock.lap("intake")
        arrived = bool(jobs or cancels or scheduler.waiting)
        broken = self._broken_invariant() if arrived else None
        plan = None if broken else scheduler.plan(state.backend.batch)
        if plan is not None:
            state.backend.use_adapters(plan.adapters)
        clock.lap("plan")
        if self._deliver_during_decode:
            state.outbox.flush()
            clock.lap("deliver")
        decoded = False  # a generation or media decode (which the check must follow)
        if isinstance(plan, ScorePlan):
            self.scoring.score(plan)
            clock.lap("decode")
        elif isinstance(plan, EmbedPlan):
            self.scoring.embed(plan)
            clock.lap("decode")
        elif isinstance(plan, MediaPlan):
            broken, decoded = self.generating.run_media(plan), True
        elif plan is not None:
            broken, decoded = self.generating.run(plan), True
        live = self._live_counts()
        shape = (*live, scheduler.cuts)
        routine = isinstance(plan, GenerationPlan) and plan.routine and shape == self._shape
        self._shape = shape
        if broken is None and (decoded or not arrived) and self._check_due(routine):
            broken = self._broken_invariant()
        clock.lap("plan")
        if broken is not None:
            self.restart(broken)
            live = self._live_counts()
        queued = len(scheduler.waiting)
        if jobs or queued != self._queued:  # the inbox's lock only when its count is off
            self.inbox.set_queued(queued)
            self._queued = queued
        now = clock.now()
        more = self.has_work()
        if live != self._live or not more or now >= self._due:
            self.publish()
            self._live, self._due = live, now + PUBLISH_EVERY_S
        if self._deliver_during_decode and more:
            clock.lap("deliver")
            return
        acks = state.outbox.flush(acknowledged=more)
        clock.lap("deliver")
        if acks:
            wait_for(acks, LOOP_WAIT_S)
            clock.lap("loops")

    def load_adapter(self, name: str, path: str) -> Adapter:
        """Load a LoRA adapter as `name` from `path` (a call from the inbox): AdapterRefused
        when RuntimeLoading's rules refuse it or the file is not an adapter of the model (its
        reason, llama.cpp's, is logged, never answered)."""
        real = self.runtime_loading.admit(self.adapters, name, path)
        try:
            self.state.backend.load_adapter(self.adapters.next_id(), real)
        except InvalidAdapter as exc:
            log.warning("LoRA adapter %s not loaded: %s", name, exc)
            raise AdapterRefused("not_lora", name, path) from None
        return self.adapters.add(name, real)

    def unload_adapter(self, name: str) -> Adapter:
        """Unload the adapter `name` (a call from the inbox): UnknownAdapter when none is
        loaded by that name, AdapterInUse while a live request runs under it."""
        adapter = self.adapters.named(name)
        if adapter is None:
            raise UnknownAdapter(name)
        users = [
            job
            for job in self.state.scheduler.live_jobs()
            if any(i == adapter.id for i, _ in job.request.adapters)
        ]
        if users:
            raise AdapterInUse(name, len(users))
        self.adapters.remove(name)
        self.state.backend.free_adapter(adapter.id)
        return adapter

    def _live_counts(self) -> tuple[int, int, int]:
        """How many jobs wait, run and score."""
        scheduler = self.state.scheduler
        return len(scheduler.waiting), len(scheduler.active), len(scheduler.scoring)

    def _check_due(self, routine: bool) -> bool:
        """Whether this step checks the invariants after its decode: any step but a routine
        one, and every CHECK_EVERY_ROUTINE-th routine step in a row."""
        self._routine = self._routine + 1 if routine else 0
        if self._routine >= CHECK_EVERY_ROUTINE:
            self._routine = 0
        return self._routine == 0

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
        self.publish()
        self.state.outbox.flush()

    def publish(self) -> None:
        """Publish the thread's figures now (`snapshot`), as after a step."""
        self.snapshot = self._stats()

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
            flash_attn=backend.flash_attn,
            scoring_jobs=len(scheduler.scoring),
            kv_cells_used=backend.cells_used(),
            prefix_cache_hits=scheduler.prefix_hits,
            prefix_cached_tokens=scheduler.prefix_tokens,
            prefix_cache_cells=scheduler.cached_cells(),
            prompt_cache_tiers=scheduler.store.tier_stats(),
            engine_steps=tally.steps,
            engine_restarts=tally.restarts,
            draft_tokens=tally.drafted,
            draft_accepted_tokens=tally.draft_accepted,
            draft_model=self.config.draft_model_path,
            step_fixed_seconds=cost.fixed_seconds(),
            step_row_seconds=cost.row_seconds(),
            step_prompt_token_seconds=cost.token_seconds() or 0.0,
            phase_seconds=self.state.clock.totals(),
        )
