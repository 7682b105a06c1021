"""Scheduling policy: which job runs, on which sequence, and what goes into the next decode.

Pure bookkeeping over a `KvCache` (no llama.cpp import, no threads), so every path of a job's
life can be driven by a scripted backend in unit tests.

Admission is FIFO. A generation needs `n` free sequence ids and a KV reservation of its
prompt plus `n × min(max_tokens, n_ctx / parallel)` cells; a request alone in the engine is
always admitted. Its lead sequence is the free one whose cached tokens share the longest
prefix with its prompt (the prefix cache), the other choices get cleared sequences and a copy
of the lead's KV once the prompt is in.

Each generation step is ONE decode holding the next token of every generating choice plus
chunks of waiting prompts (a prompt alone in the engine decodes its last token in a chunk of its
own, see `_plan_generation`): up to the batch's room while nothing generates, else as many
prompt tokens as keep the step within (1 + PREFILL_SHARE) times what it costs without them
(`StepCost`, measured), and at least `prefill_chunk`: a newcomer's prefill holds running
streams for about one more step's time per step instead of for its whole prompt.
Score requests alternate with generation steps: one chunk of one text per turn, decoded alone
in a separate scoring context (scores must not depend on what else runs), shorter while
streams wait on it. Embeddings requests take the same turns: one decode of up to EMBED_CHUNK
tokens of their texts (fewer while streams wait; a long text is split across decodes unless
its model pools whole texts) in a separate embeddings context.

When the KV cache is full anyway, a free sequence's prompt cache goes first, then the
generating choice that holds the most cells ends with `length`; a prefilling job is never cut
in half: with nothing else to give, the newest one goes back to the head of the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from edgeserve.engine.draft_model import DraftModel, DraftWant, batch_size
from edgeserve.engine.jobs import (
    EMBED_CHUNK,
    EMBED_MAX_SEQS,
    AnyJob,
    Choice,
    EmbedJob,
    Job,
    JobState,
    ScoreJob,
)
from edgeserve.engine.ports import Batch, DecodeLimits, EmbedSpan, KvCache
from edgeserve.engine.scoring import TextState
from edgeserve.engine.slots import SharedCells, SlotPool
from edgeserve.engine.speculation import STEP_ROWS, Drafter, DraftPace, draft_room
from edgeserve.engine.step_cost import StepCost
from edgeserve.engine.types import EngineConfig

# Tokens (and logit rows) per score decode: a multiple of the CPU kernels' row blocks, so a
# chunked text gives the same rows as a lone decode.
SCORE_CHUNK = 64
# While chat streams run, score chunks alternate with their steps: a shorter chunk keeps their
# next token from waiting on 64 logit rows (~2.5 ms each on a 262k vocabulary).
SCORE_CHUNK_BESIDE_STREAMS = 16
# Tokens per embeddings decode while chat streams run, so that their next token waits on no
# more than a score chunk does.
EMBED_CHUNK_BESIDE_STREAMS = SCORE_CHUNK_BESIDE_STREAMS
# Beside running streams, a step's prompt tokens may add this share of what the step costs
# without them (1.0: a stream's next token comes at most about twice as late).
PREFILL_SHARE = 1.0
# Beside other streams, a step's drafted rows may add this share of what the step costs
# without them: a stream's tokens are not held back by others' speculation (on a 2-core CPU a
# row costs a third or more of a 4-stream step, so only a sequence alone drafts there; on a GPU
# rows are cheap).
DRAFT_SHARE = 0.05


def decode_limits(config: EngineConfig) -> DecodeLimits:
    """The most this scheduler hands a backend per decode, for a backend to size itself by."""
    return DecodeLimits(
        score_rows=SCORE_CHUNK,
        embed_tokens=EMBED_CHUNK,
        embed_seqs=EMBED_MAX_SEQS,
        draft_rows=STEP_ROWS if config.draft_max > 0 else 0,
        draft_batch=batch_size(config.prefill_chunk, config.parallel),
    )


@dataclass
class EmbedPlan:
    """An embeddings step: these spans of `job`'s texts, side by side."""

    job: EmbedJob
    spans: list[EmbedSpan]


class InvariantError(AssertionError):
    """The scheduler's bookkeeping disagrees with itself or with the KV cache."""


@dataclass
class GenerationPlan:
    """A generation step: which batch rows to sample for which choice (the first row, then one
    per drafted token after it), which prompts advance."""

    rows: list[tuple[int, Job, Choice, tuple[int, ...]]] = field(default_factory=list)
    # (job, prompt tokens taken, batch row of the prompt's last token when this chunk ends it)
    prefills: list[tuple[Job, int, int | None]] = field(default_factory=list)

    @property
    def logit_rows(self) -> int:
        """The rows this step asks logits for (next tokens and drafts), prompts aside."""
        return sum(1 + len(draft) for _, _, _, draft in self.rows)

    @property
    def ending_prompts(self) -> int:
        """Prompts whose last token is in this step (each gives one more logit row)."""
        return sum(row is not None for _, _, row in self.prefills)

    @property
    def prompt_tokens(self) -> int:
        """The prompt tokens of this step that give no logit row."""
        return sum(take for _, take, _ in self.prefills) - self.ending_prompts


@dataclass
class ScorePlan:
    """A score step: `take` tokens of `text` from `start`, or (classifier) the whole text."""

    job: ScoreJob
    text: TextState
    start: int
    take: int
    outputs: list[int]


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
    ) -> None:
        self.kv = kv
        self.n_ctx = n_ctx
        self.n_seq = n_seq
        self.prefill_chunk = max(1, prefill_chunk)
        self.draft_max = draft_max
        self.draft_model = draft_model  # drafts in place of n-gram lookups when set
        self.step_cost = StepCost()
        self.slots = SlotPool(n_seq)
        self.sharing = SharedCells(n_seq)
        self.waiting: deque[AnyJob] = deque()
        self.active: list[Job] = []
        self.scoring: list[ScoreJob | EmbedJob] = []
        self.reserved = 0
        self.prefix_hits = 0
        self.prefix_tokens = 0
        self._score_turn = True

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
        while self.waiting and self._can_admit(self.waiting[0]):
            job = self.waiting.popleft()
            if isinstance(job, ScoreJob | EmbedJob):
                job.state = JobState.GENERATING
                self.scoring.append(job)
                continue
            lead, common = self.slots.take_best(job.tokens)
            cached = self._reuse_prefix(lead, common, len(job.tokens))
            seqs = [lead] + [self._take_cleared() for _ in range(job.request.n - 1)]
            try:
                job.choices = open_choices(job, seqs)
            except Exception as exc:
                self.slots.give_back(lead, job.tokens[:cached])
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
            while self.reserved + self.slots.cached_cells > self.n_ctx and self._evict_cache():
                pass
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
        if self.draft_model is not None:
            self.draft_model.clear()
        return ended

    def _release(self, job: Job, choice: Choice) -> None:
        choice.done = True
        choice.sampler.free()
        self._cut(choice.seq_id, choice.n_past)  # cells of an unverified draft
        self.slots.give_back(choice.seq_id, choice.held_tokens(job.tokens))

    def _retire(self, job: Job) -> None:
        self.active.remove(job)
        self.reserved -= job.prompt.reserve

    # ---- sequences and the prompt cache -----------------------------------------------------

    def _reuse_prefix(self, seq: int, common: int, n_prompt: int) -> int:
        """Keep the first `common` cached cells of `seq` (at least one prompt token is always
        decoded again, for its logits); drop the rest. Returns how many were kept."""
        common = min(common, n_prompt - 1)
        if common > 0 and self.kv.seq_pos_range(seq)[0] == 0 and self._cut(seq, common):
            return common
        self._cut(seq, -1)
        return 0

    def _take_cleared(self) -> int:
        seq = self.slots.take_any()
        self._cut(seq, -1)
        return seq

    def _cut(self, seq: int, keep: int) -> bool:
        """Drop the cells of `seq` from position `keep` on (-1: all of them); False when
        the cache cannot."""
        if not self.kv.seq_rm(seq, keep, -1):
            return False
        self.sharing.trimmed(seq, max(keep, 0))
        return True

    def cached_cells(self) -> int:
        """The distinct KV cells the free sequences hold (the prompt cache), as recorded
        here: a cell that several of them share (the prompt of an n > 1 request) counts once."""
        return self.sharing.distinct({seq: len(self.slots.held(seq)) for seq in self.slots})

    def _evict_cache(self) -> bool:
        """Drop the least recently used prompt cache; False when none is left."""
        seq = self.slots.evict_lru()
        if seq is None:
            return False
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

    def plan(self, batch: Batch) -> GenerationPlan | ScorePlan | EmbedPlan | None:
        """The next step: a score chunk, embeddings or a generation batch (written into
        `batch`), alternating when both wait; None when there is nothing to decode."""
        batch.clear()
        if self.scoring and (not self.active or self._score_turn):
            self._score_turn = False
            job = self.scoring[0]
            if isinstance(job, EmbedJob):
                budget = EMBED_CHUNK_BESIDE_STREAMS if self.active else EMBED_CHUNK
                return EmbedPlan(job, job.next_spans(budget))
            return self._plan_score(job)
        self._score_turn = True
        if not any(job.steppable for job in self.active):
            return None
        return self._plan_generation(batch)

    def _plan_score(self, job: ScoreJob) -> ScorePlan:
        text = job.current_text()
        if text is None:  # nothing left to score (empty texts): the job just completes
            return ScorePlan(job, TextState([]), 0, 0, [])
        if text.classify:
            return ScorePlan(job, text, 0, len(text.tokens), [])
        chunk = SCORE_CHUNK_BESIDE_STREAMS if self.active else SCORE_CHUNK
        take = min(len(text.tokens) - text.fed, chunk)
        return ScorePlan(job, text, text.fed, take, text.outputs_in(text.fed, take))

    def _plan_generation(self, batch: Batch) -> GenerationPlan:
        plan = GenerationPlan()
        generating = 0
        prefilling: list[Job] = []
        stepping: list[tuple[Job, Choice]] = []
        for job in self.active:
            if job.state is JobState.PREFILLING:
                prefilling.append(job)
                continue
            generating += 1
            stepping += [(job, c) for c in job.choices if not c.done and c.pending is None]
        room = draft_room(len(stepping), self.draft_max)
        threshold = self.step_cost.threshold(len(stepping))
        if self.draft_model is not None:
            step_s = self.step_cost.generation_seconds(max(1, len(stepping)))
            threshold += self.draft_model.step_share(step_s)
        spare = min(batch.room - len(stepping) - 1, self._draft_rows_beside(len(stepping)))
        drafts = self._drafts(stepping, room, threshold, spare)
        for (job, choice), draft in zip(stepping, drafts, strict=True):
            row = batch.add(choice.last_token, choice.n_past, choice.seq_id, True)
            if draft:
                batch.add_span(draft, choice.n_past + 1, choice.seq_id, range(len(draft)))
            plan.rows.append((row, job, choice, tuple(draft)))
        budget = batch.room
        row_tokens = 0
        if generating:
            budget = min(budget, self._prefill_budget(plan.logit_rows))
            row_tokens = self._row_in_prompt_tokens()
        # Alone in the engine, a prompt's last token (whose row gives the first answer token)
        # is decoded in a step of its own, as it is after a prefix-cache hit: llama.cpp's CPU
        # kernels give a row different values inside a multi-row chunk, so a cold prompt would
        # otherwise answer differently from the same prompt found in the cache. Beside other
        # work the batch varies anyway, and the extra step would only delay first tokens.
        quiet = not generating and len(prefilling) == 1
        for job in prefilling:
            left = len(job.tokens) - job.prefilled
            take = min(batch.room, budget, left - 1 if quiet and left > 1 else left)
            if take <= 0:
                break
            last = job.prefilled + take == len(job.tokens)
            budget -= take + (row_tokens if last else 0)
            start = batch.add_span(
                job.tokens[job.prefilled : job.prefilled + take],
                job.prefilled,
                job.lead.seq_id,
                (take - 1,) if last else (),
            )
            plan.prefills.append((job, take, start + take - 1 if last else None))
        return plan

    def _draft_rows_beside(self, sequences: int) -> int:
        """Drafted rows a step of `sequences` next tokens may carry in all: a sequence alone
        drafts what pays for itself, but beside others its drafts may add only DRAFT_SHARE
        to the step (each row delays every other stream's next token). Unbounded until a
        row's cost is measured."""
        per_row = self.step_cost.row_seconds()
        step = self.step_cost.generation_seconds(sequences)
        if sequences <= 1 or per_row <= 0.0 or step is None:
            return STEP_ROWS
        return int(DRAFT_SHARE * step / per_row)

    def _prefill_budget(self, rows: int) -> int:
        """Prompt tokens a step may take beside `rows` logit rows of running streams: as
        many as keep it within (1 + PREFILL_SHARE) times its cost without them, at least
        `prefill_chunk` (also while the costs are not measured yet)."""
        cost = self.step_cost
        alone = cost.generation_seconds(rows)
        if alone is None:
            return self.prefill_chunk
        fit = cost.prompt_tokens_within(alone * (1.0 + PREFILL_SHARE), rows)
        return max(self.prefill_chunk, fit or 0)

    def _row_in_prompt_tokens(self) -> int:
        """What the logit row of a prompt's last token costs, in prompt tokens."""
        per_token = self.step_cost.token_seconds()
        if not per_token:
            return 0
        return round(self.step_cost.row_seconds() / per_token)

    def _drafts(
        self, stepping: list[tuple[Job, Choice]], room: int, threshold: float, spare: int
    ) -> list[list[int]]:
        """The tokens each stepping choice drafts this step, in order (see speculation.py):
        n-gram lookups, or the draft model asked once for all of them. None for a grammar's
        detached sampler, and never past `room`, the answer's token limit, the context or the
        `spare` drafted rows the step may still take (the batch, and beside other streams
        DRAFT_SHARE of the step)."""
        drafts: list[list[int]] = [[] for _ in stepping]
        wants: list[tuple[int, DraftWant]] = []
        for i, (job, choice) in enumerate(stepping):
            if self.draft_max <= 0 or choice.sampler.detached:
                continue
            if choice.drafter is None:
                choice.drafter = DraftPace() if self.draft_model else Drafter(job.tokens)
            limit = min(
                room, spare, job.prompt.max_new - choice.n_gen - 1, self.n_ctx - choice.n_past - 2
            )
            if isinstance(choice.drafter, Drafter):
                drafts[i] = choice.drafter.draft(choice.generated, limit, threshold)
                spare -= len(drafts[i])
            elif k := choice.drafter.want(limit, threshold):
                wants.append((i, DraftWant(choice.seq_id, job.tokens + choice.generated, k)))
                spare -= k
        if wants and self.draft_model is not None:
            made = self.draft_model.draft([want for _, want in wants])
            for (i, _), draft in zip(wants, made, strict=True):
                drafts[i] = draft
        return drafts

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
                continue
            for choice in job.choices[1:]:
                self.kv.seq_cp(job.lead.seq_id, choice.seq_id)
                self.sharing.copied(job.lead.seq_id, choice.seq_id, job.lead.n_past)
                choice.n_past = job.lead.n_past
            job.state = JobState.GENERATING
            to_sample.extend((row, job, choice, ()) for choice in job.choices)
        return to_sample

    def keep(self, choice: Choice, drafted: int, accepted: int) -> None:
        """A verified draft of a live choice: the cells of its rejected tokens are removed."""
        self._cut(choice.seq_id, choice.n_past)
        if choice.drafter is not None:
            choice.drafter.adapt(drafted, accepted)

    # ---- checks -----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise InvariantError unless: each sequence id is owned by at most one live choice or
        is free, never both; every stored sequence is contiguous from position 0 and ends
        where its owner's next token goes; no ended job is in a live collection; the
        reservations add up; each draft model sequence holds what it recorded."""
        owners: dict[int, tuple[int, int]] = {}
        for job in self.active:
            _expect(
                job.state in (JobState.PREFILLING, JobState.GENERATING) and not job.finished,
                f"job {job.rid} is active in state {job.state.value}",
            )
            for choice in job.choices:
                if choice.done:
                    continue
                seq = choice.seq_id
                _expect(seq not in owners, f"sequence {seq} has two owners")
                _expect(seq not in self.slots, f"sequence {seq} is owned and free")
                owners[seq] = (job.rid, choice.index)
                who = f"job {job.rid} choice {choice.index}"
                self._expect_cells(seq, choice.n_past, who)
            if job.state is JobState.PREFILLING:
                _expect(
                    job.lead.n_past == job.prefilled, f"job {job.rid} lead is not at its prefill"
                )
        for seq in range(self.n_seq):
            if seq in self.slots:
                self._expect_cells(seq, len(self.slots.held(seq)), "free")
            else:
                _expect(seq in owners, f"sequence {seq} is neither owned nor free")
        for job in self.waiting:
            _expect(job.state is JobState.QUEUED, f"job {job.rid} waits in {job.state.value}")
        for sjob in self.scoring:
            _expect(sjob.state is JobState.GENERATING, f"score job {sjob.rid} is not running")
        reserved = sum(job.prompt.reserve for job in self.active)
        _expect(self.reserved == reserved, f"reserved {self.reserved} != {reserved} live")
        if self.draft_model is not None:
            mismatch = self.draft_model.mismatch()
            _expect(mismatch is None, f"{mismatch}")

    def _expect_cells(self, seq: int, n_past: int, who: str) -> None:
        """Check that `seq` holds exactly positions 0 … n_past-1."""
        first, last = self.kv.seq_pos_range(seq)
        if n_past == 0:
            _expect(last < 0, f"sequence {seq} ({who}) should be empty, holds up to {last}")
        else:
            _expect(
                first == 0 and last == n_past - 1,
                f"sequence {seq} ({who}) holds [{first}, {last}], expected [0, {n_past - 1}]",
            )


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise InvariantError(message)
