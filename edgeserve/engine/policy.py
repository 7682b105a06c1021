"""Scheduling policy: which job runs, on which sequence, and what it holds in the KV cache.

Pure bookkeeping over a `KvCache` (no llama.cpp import, no threads), so every path of a job's
life can be driven by a scripted backend in unit tests.

Admission is FIFO. A generation needs `n` free sequence ids and a KV reservation of its
prompt plus `n × min(max_tokens, n_ctx / parallel)` cells; a request alone in the engine is
always admitted. Its lead sequence is the free one whose cached tokens share the longest
prefix with its prompt under the same LoRA adapter set (the prefix cache; a media item is
reused whole or not at all), the other choices get cleared sequences and a copy of the lead's
KV once the prompt is in. Which sequences share cells that way is recorded (`SharedCells`), so
that a cell several sequences hold counts once.

On models with sliding-window attention, a sequence keeps only the last window of its sliding
layers; checkpoints of that window taken while prompts are decoded (`WindowCheckpoints`) let
a shorter prefix be reused from the latest one at or before its end.

What goes into each decode is planned by `planning.Planner`, which the scheduler owns.

What a free sequence loses (its cells given to another request, or evicted) is first copied
to the tiers below the KV cache (`PromptStore`: host memory, and a disk folder when set up),
and a prompt that shares a longer prefix with a stored entry than with any sequence gets it
put back. As a generation starts, the other free sequences' cells go to host memory that way
too (a decode attends over every used cell of the unified cache), unless memory cannot take them.

When the KV cache is full anyway, a free sequence's prompt cache goes first, then the
generating choice that holds the most cells ends with `length`; a prefilling job is never cut
in half: with nothing else to give, the newest one goes back to the head of the queue.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from edgeserve.engine.checkpoints import WindowCheckpoints
from edgeserve.engine.draft_model import DraftModel
from edgeserve.engine.invariants import InvariantError, check_scheduler
from edgeserve.engine.jobs import AnyJob, Choice, EmbedJob, Job, JobState, ScoreJob
from edgeserve.engine.planning import EmbedPlan, GenerationPlan, MediaPlan, Planner, ScorePlan
from edgeserve.engine.ports import Batch, KvCache
from edgeserve.engine.prompt_store import MIN_TOKENS, PromptStore, SequenceState
from edgeserve.engine.slots import FreeCells, SharedCells, SlotPool
from edgeserve.engine.types import AdapterSet

log = logging.getLogger("edgeserve.engine")


OpenChoices = Callable[[Job, list[int]], list[Choice]]


class Scheduler:
    """Owns the live collections, the slot pool and the KV reservations."""

    def __init__(
        self,
        kv: KvCache,
        *,
        n_ctx: int,
        n_seq: int,
        prefill_chunk: int,
        draft_max: int = 0,
        draft_model: DraftModel | None = None,
        offloaded: bool = False,
        store: PromptStore | None = None,
    ) -> None:
        self.kv = kv
        self.store = store or PromptStore(ram_bytes=0)
        self.n_ctx = n_ctx
        self.n_seq = n_seq
        self.draft_model = draft_model  # drafts in place of n-gram lookups when set
        self.windows = WindowCheckpoints(kv.checkpoint_budget, kv.n_swa)
        self.planner = Planner(
            n_ctx=n_ctx,
            prefill_chunk=prefill_chunk,
            draft_max=draft_max,
            draft_model=draft_model,
            checkpoint_spacing=self.windows.spacing,
            offloaded=offloaded,
        )
        self.slots = SlotPool(n_seq)
        self.sharing = SharedCells(n_seq)
        self._free_cells = FreeCells()
        self.waiting: deque[AnyJob] = deque()
        self.active: list[Job] = []
        self.scoring: list[ScoreJob | EmbedJob] = []
        self.reserved = 0
        self.prefix_hits = 0
        self.prefix_tokens = 0
        self.restored_tokens = 0  # of those, the ones a stored entry gave back
        self.cuts = 0  # how many times cells were dropped from a sequence (`_cut`)
        # Free sequences whose tokens could not be stored (no copy, or too large for the
        # tiers): not tried again while idle until they hold something else.
        self._unstorable: set[int] = set()
        # Free sequences the memory tier did not take when they were parked (_park_idle):
        # they keep their cells, and are not copied again until they hold something else.
        self._unparked: set[int] = set()

    # ---- what is there to do ----------------------------------------------------------------

    def has_work(self) -> bool:
        """True when the next step would decode something (a job whose only choices wait on
        a detached sample has nothing to decode until it arrives)."""
        return bool(
            any(job.steppable for job in self.active)
            or self.scoring
            or (self.waiting and self._can_admit(self.waiting[0]))
        )

    def live_jobs(self) -> list[AnyJob]:
        """Every job that has not ended, in no particular order."""
        return [*self.waiting, *self.active, *self.scoring]

    def _can_admit(self, job: AnyJob) -> bool:
        if isinstance(job, ScoreJob | EmbedJob):
            return True
        if len(self.slots) < job.request.n:
            return False
        return not self.active or self.reserved + job.prompt.reserve <= self.n_ctx

    # ---- life of a job ----------------------------------------------------------------------

    def enqueue(self, job: AnyJob) -> None:
        """A new job waits for admission."""
        if job.state is not JobState.QUEUED:
            raise InvariantError(f"job {job.rid} enqueued in state {job.state.value}")
        self.waiting.append(job)

    def admit(self, open_choices: OpenChoices) -> list[tuple[AnyJob, Exception]]:
        """Admit waiting jobs in order while they fit. `open_choices(job, seqs)` makes the
        choices (their samplers); a job for which it raises is ended and returned with the
        error, and its sequences go back untouched."""
        failed: list[tuple[AnyJob, Exception]] = []
        started = False
        while self.waiting and self._can_admit(self.waiting[0]):
            job = self.waiting.popleft()
            if isinstance(job, ScoreJob | EmbedJob):
                job.state = JobState.GENERATING
                self.scoring.append(job)
                continue
            adapters = job.request.adapters
            lead, common = self.slots.best(job.tokens, adapters)
            cached = self._take_lead(job, lead, common)
            seqs = [lead] + [self._take_cleared() for _ in range(job.request.n - 1)]
            try:
                job.choices = open_choices(job, seqs)
            except Exception as exc:
                self.slots.give_back(lead, job.tokens[:cached], adapters)
                for seq in seqs[1:]:
                    self.slots.give_back(seq, [])
                job.state = JobState.CANCELLED
                failed.append((job, exc))
                continue
            job.cached = job.prefilled = cached
            job.lead.n_past = cached
            job.state = JobState.PREFILLING
            if cached:
                self.prefix_hits += 1
                self.prefix_tokens += cached
            self.reserved += job.prompt.reserve
            self.active.append(job)
            started = True
            while self.reserved + self.cached_cells() > self.n_ctx and self._evict_cache():
                pass
        if started:
            self._park_idle()
        return failed

    def cancel(self, job: AnyJob) -> bool:
        """End a job wherever it is (its choices' samplers freed, its sequences returned with
        the cells they hold as prompt cache). False when it had already ended."""
        if job.state.ended:
            return False
        if job.state is JobState.QUEUED:
            self.waiting.remove(job)
        elif isinstance(job, ScoreJob | EmbedJob):
            self.scoring.remove(job)
        else:
            for choice in job.choices:
                if not choice.done:
                    self._release(job, choice)
            self._retire(job)
        job.state = JobState.CANCELLED
        return True

    def finish(self, job: Job, choice: Choice) -> None:
        """Choice `choice` ended; the job is DONE (and leaves `active`) with its last one."""
        self._release(job, choice)
        if job.finished:
            self._retire(job)
            job.state = JobState.DONE

    def finish_score(self, job: ScoreJob | EmbedJob) -> None:
        """A score or embeddings job has its result."""
        self.scoring.remove(job)
        job.state = JobState.DONE

    def reset(self) -> list[AnyJob]:
        """After the context was made anew: every running job is ended (returned, so their
        owners can be told) and every sequence is empty. Waiting jobs stay queued."""
        ended: list[AnyJob] = [*self.active, *self.scoring]
        for job in self.active:
            for choice in job.choices:
                if not choice.done:
                    choice.done = True
                    choice.sampler.free()
            job.state = JobState.CANCELLED
        for sjob in self.scoring:
            sjob.state = JobState.CANCELLED
        self.active = []
        self.scoring = []
        self.reserved = 0
        self.slots = SlotPool(self.n_seq)
        self.sharing = SharedCells(self.n_seq)
        self._unstorable.clear()
        self._unparked.clear()
        self.windows.clear()
        if self.draft_model is not None:
            self.draft_model.clear()
        return ended

    def _release(self, job: Job, choice: Choice) -> None:
        self._unstorable.discard(choice.seq_id)
        self._unparked.discard(choice.seq_id)
        choice.done = True
        choice.sampler.free()
        self._cut(choice.seq_id, choice.n_past)  # cells of an unverified draft
        self.slots.give_back(choice.seq_id, choice.held_tokens(job.tokens), job.request.adapters)

    def _retire(self, job: Job) -> None:
        self.active.remove(job)
        self.reserved -= job.prompt.reserve

    # ---- sequences and the prompt cache -----------------------------------------------------

    def _take_lead(self, job: Job, seq: int, common: int) -> int:
        """Take free sequence `seq`, which shares `common` tokens with the job's prompt, as
        its lead, holding the longest reusable prefix that it or a stored entry gives
        (what it loses is stored first); how many prompt tokens it holds."""
        held, under = self.slots.held(seq), self.slots.adapters_of(seq)
        self.slots.take(seq)
        limit = job.prompt.tail_start
        common = job.prompt.reusable(min(common, limit))
        restored = self._restore(job, seq, common, held, under)
        if restored is None:
            self._spill(seq, held, under, keep=common)
        else:
            common = restored
        return self._reuse_prefix(seq, common, limit)

    def _restore(
        self, job: Job, seq: int, common: int, held: list[int], under: AdapterSet
    ) -> int | None:
        """Put the stored entry sharing the longest prefix with the job's prompt into `seq`
        when it gives at least MIN_TOKENS more than `common` (what `seq` held, `held` under
        `under`, is stored first): the prefix it gives (0 when it could not be put back), or
        None when no entry is worth it."""
        if not self.store.enabled:
            return None
        tokens, adapters = job.tokens, job.request.adapters
        entry, shared = self.store.best(tokens, adapters)
        shared = job.prompt.reusable(min(shared, job.prompt.tail_start))
        if entry is None or shared < common + MIN_TOKENS:
            if job.prompt.tail_start - common >= MIN_TOKENS:
                self.store.missed()
            return None
        state = self.store.load(entry)
        if state is None:
            return None
        self._spill(seq, held, under, keep=0)
        self._cut(seq, -1)
        need = len(entry.tokens)
        while self.reserved + self.cached_cells() + need > self.n_ctx and self._evict_cache():
            pass
        if self.reserved + self.cached_cells() + need > self.n_ctx:
            return 0
        if not self.kv.restore_sequence(seq, state.kv):
            log.warning("prompt cache: a stored prompt of %d tokens did not fit back", need)
            return 0
        for position, window in state.windows:
            self.windows.add(seq, position, window)
        self.restored_tokens += shared
        return shared

    def _spill(
        self, seq: int, tokens: list[int], adapters: AdapterSet, keep: int, durable: bool = False
    ) -> None:
        """Store what `seq` holds (`tokens`, under `adapters`) in the tiers that lack it,
        before all but its first `keep` cells go (when that loses MIN_TOKENS or more); with
        `durable`, while it keeps them, on disk alone (`PromptStore.wanted`)."""
        if len(tokens) - keep < MIN_TOKENS or (durable and seq in self._unstorable):
            return
        tiers = self.store.wanted(tokens, adapters, durable)
        if not tiers:
            return
        copied = self.kv.save_sequence(seq)
        if copied is not None:
            kv, kv_bytes = copied
            windows = tuple((c.position, c.state) for c in self.windows.of(seq))
            window_bytes = sum(memoryview(state).nbytes for _, state in windows)  # type: ignore[arg-type]
            state = SequenceState(kv, kv_bytes, windows, window_bytes)
            self.store.put(tokens, adapters, state, tiers)
        if durable and self.store.wanted(tokens, adapters, durable):  # no copy: not again
            self._unstorable.add(seq)

    def unstored(self) -> bool:
        """Whether a free sequence holds MIN_TOKENS or more that the disk tier lacks."""
        return self.store.disk is not None and any(
            seq not in self._unstorable
            and self.store.wanted(self.slots.held(seq), self.slots.adapters_of(seq), True)
            for seq in self.slots
        )

    def spill_free(self) -> None:
        """Write what every free sequence holds to the disk tier (while idle, and before the
        process ends), where it lacks it."""
        for seq in self.slots:
            self._spill(
                seq, self.slots.held(seq), self.slots.adapters_of(seq), keep=0, durable=True
            )

    def _reuse_prefix(self, seq: int, common: int, limit: int) -> int:
        """Keep the first `common` cached cells of `seq`, `limit` at most (the prompt's last
        tokens are always decoded again, for the first answer token's logits) when the window
        of the next position still finds them all (see KvCache), else as many as its latest
        checkpoint at or before `common` gives back; drop the rest. Returns how many were
        kept."""
        common = min(common, limit)
        if common <= 0:
            self._cut(seq, -1)
            return 0
        first = self.kv.seq_pos_range(seq)[0]
        if 0 <= first <= self.window_start(common) and self._cut(seq, common):
            return common
        checkpoint = self.windows.best(seq, common)
        if (
            checkpoint is not None
            and self._cut(seq, checkpoint.position)
            and self.kv.restore_window(seq, checkpoint.state)
        ):
            return checkpoint.position
        self._cut(seq, -1)
        return 0

    def _take_cleared(self) -> int:
        seq = self.slots.lru()
        held, under = self.slots.held(seq), self.slots.adapters_of(seq)
        self.slots.take(seq)
        self._spill(seq, held, under, keep=0)
        self._cut(seq, -1)
        return seq

    def _cut(self, seq: int, keep: int) -> bool:
        """Drop the cells of `seq` from position `keep` on (-1: all of them); False when
        the cache cannot."""
        self.cuts += 1
        if not self.kv.seq_rm(seq, keep, -1):
            return False
        self.sharing.trimmed(seq, max(keep, 0))
        self.windows.trimmed(seq, keep)
        return True

    def cached_cells(self) -> int:
        """The distinct KV cells the free sequences hold (the prompt cache), as recorded
        here: a cell that several of them share (the prompt of an n > 1 request) counts once.
        Worked out again only after the free sequences or their sharing changed (the engine
        publishes it every step)."""
        return self._free_cells.of(self.slots, self.sharing)

    def _park_idle(self) -> None:
        """Move what the free sequences hold into the memory tier and out of the KV cache,
        as a generation starts. In a unified cache a decode attends over every used cell up
        to the highest (masked for the other sequences), so an idle prompt cache slows every
        running stream; from memory it comes back at the cost of a copy (llama-server clears
        idle slots the same way). A sequence the memory tier does not take (no tier, or too
        large for it) keeps its cells; one shorter than MIN_TOKENS is decoded again."""
        if self.store.ram_bytes <= 0:
            return
        for seq in self.slots:
            held, under = self.slots.held(seq), self.slots.adapters_of(seq)
            if not held or seq in self._unparked:
                continue
            self._spill(seq, held, under, keep=0)
            if "ram" in self.store.wanted(held, under, durable=False):
                self._unparked.add(seq)  # not stored: its cells are its only copy
                continue
            self.slots.forget(seq)
            self._cut(seq, -1)

    def _evict_cache(self) -> bool:
        """Drop the least recently used prompt cache (stored first); False when none is
        left."""
        seq = self.slots.lru_holding()
        if seq is None:
            return False
        self._spill(seq, self.slots.held(seq), self.slots.adapters_of(seq), keep=0)
        self.slots.forget(seq)
        self._cut(seq, -1)
        return True

    def relieve_kv(self) -> tuple[Job, Choice] | Job | None:
        """The last decode found no room (nothing was stored). Free some: a prompt cache
        (None), else the running choice holding the most cells, for the caller to end with
        `length`, else the newest prefilling job, put back at the head of the queue."""
        if self._evict_cache():
            return None
        running = [
            (c.n_past, j, c)
            for j in self.active
            if j.state is JobState.GENERATING
            for c in j.choices
            if not c.done
        ]
        if running:
            _, job, choice = max(running, key=lambda t: t[0])
            return job, choice
        if not self.active:
            return None
        job = self.active[-1]
        for choice in job.choices:
            self._release(job, choice)
        self._retire(job)
        job.choices = []
        job.prefilled = job.cached = 0
        job.state = JobState.QUEUED
        self.waiting.appendleft(job)
        return job

    # ---- planning ---------------------------------------------------------------------------

    def plan(self, batch: Batch) -> GenerationPlan | MediaPlan | ScorePlan | EmbedPlan | None:
        """The next step (see planning.py), written into `batch` for a generation."""
        return self.planner.plan(batch, self.active, self.scoring)

    def commit(self, plan: GenerationPlan) -> list[tuple[int, Job, Choice, tuple[int, ...]]]:
        """The plan's decode succeeded: advance every sequence by its next token, copy
        finished prompts to their sibling sequences, and return the (row, job, choice,
        draft) to sample, in batch order. A draft's cells count once verified (`keep`)."""
        to_sample = list(plan.rows)
        for _, _, choice, _ in plan.rows:
            choice.n_past += 1
        for job, take, row in plan.prefills:
            job.prefilled += take
            job.lead.n_past = job.prefilled
            if row is None:
                self._checkpoint(job)
                continue
            for choice in job.choices[1:]:
                self.kv.seq_cp(job.lead.seq_id, choice.seq_id)
                self.sharing.copied(job.lead.seq_id, choice.seq_id, job.lead.n_past)
                choice.n_past = job.lead.n_past
            job.state = JobState.GENERATING
            to_sample.extend((row, job, choice, ()) for choice in job.choices)
        return to_sample

    def _checkpoint(self, job: Job) -> None:
        """Copy the window of the job's lead sequence before the next prompt position when
        one is due there."""
        seq, position = job.lead.seq_id, job.prefilled
        if self.windows.due(seq, position, job.prompt.tail_start, job.prompt.marks):
            state = self.kv.save_window(seq, position)
            if state is not None:
                self.windows.add(seq, position, state)

    def commit_media(self, plan: MediaPlan) -> None:
        """The plan's media item is decoded: its job's prompt goes on after it."""
        job = plan.job
        job.prefilled = job.lead.n_past = plan.span.end

    def keep(self, choice: Choice, drafted: int, accepted: int) -> None:
        """A verified draft of a live choice: the cells of its rejected tokens are removed."""
        self._cut(choice.seq_id, choice.n_past)
        if choice.drafter is not None:
            choice.drafter.adapt(drafted, accepted)

    # ---- checks -----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise InvariantError where the bookkeeping disagrees with itself or with the KV
        cache (invariants.py says what is checked)."""
        check_scheduler(self)

    def window_start(self, position: int) -> int:
        """The first position that the token at `position` attends to (0 without a sliding
        window): a sequence may have lost the cells before it."""
        n_swa = self.kv.n_swa
        return max(0, position + 1 - n_swa) if n_swa > 0 else 0
