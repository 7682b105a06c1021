"""What goes into the next decode: a score chunk, embeddings, or a generation step.

Each generation step is ONE decode holding the next token of every generating choice plus
chunks of waiting prompts (a prompt alone in the engine decodes its last token in a chunk of its
own, see `_plan_generation`; with sliding-window checkpoints, chunks also end at their
positions, see checkpoints.py): up to the batch's room while nothing generates, else as many
prompt tokens as keep the step within (1 + PREFILL_SHARE) times what it costs without them
(`StepCost`, measured), and at least `prefill_chunk`: a newcomer's prefill holds running
streams for about one more step's time per step instead of for its whole prompt. Drafted
tokens ride in the same decode, as many as draft_sizing.py decides.
A prompt chunk alone in its decode that the batch's room cuts ends at a multiple of
CHUNK_ALIGN, as checkpoint positions are, so the chunks after it start on one; and a prompt's
last tokens (Prompt.tail) leave the chunk before them a multiple of the backend's
`row_multiple` long. On a CPU, llama.cpp's flash-attention kernel takes the cells in tiles of
64: a chunk of 512 tokens not starting on a tile's edge cost ~20 ms more on Gemma 3 270M
(1,038 against 1,015-1,020 ms after ~1,000 cached, 1,237 against 1,214-1,219 after ~4,600);
and it deals a chunk's rows (tokens times heads) out in four slices per thread, where slices
that straddle two heads add a tile each (192 tokens after 4,608: 555 ms, 191 or 193: 621-626;
model.py `row_multiple`).
A prompt with only its tail left (found in the prefix cache, or its other tokens decoded
while it was alone) takes a step's budget before other prompts' chunks: beside running
streams it does not wait for a longer prompt's chunks. While nothing generates, it decodes
with the prompts that joined it rather than in a step of its own: that would answer it
~450 ms sooner among four chats arriving together on Gemma 3 270M, but the others' whole
prefill would then fall between its first two tokens (inter-token p99 at eight streams
357 ms against ~180).
An image or audio clip in a prompt is decoded in a step of its own (`MediaPlan`: its
embeddings, all in one micro-batch, non-causal where the projector says so); media steps
alternate with generation steps while other streams run, and a prompt's tokens never run into
a media item in the same decode.
Score requests alternate with generation steps: one chunk of one text per turn, decoded alone
in a separate scoring context (scores must not depend on what else runs), shorter while
streams wait on it. Embeddings requests take the same turns: one decode of up to EMBED_CHUNK
tokens of their texts (fewer while streams wait; a long text is split across decodes unless
its model pools whole texts) in a separate embeddings context.
LoRA adapters: llama.cpp applies one adapter set to a context at a time, so a step serves the
jobs of one set only (`AdapterTurns`): while jobs under several sets run, their generation and
media steps take turns, one step per set in a fixed order, so no set waits for more than one
step of each other; a score or embeddings step runs under its own job's set.

Pure bookkeeping (no llama.cpp import, no threads), like the scheduler that owns it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from edgeserve.engine.draft_model import DraftModel, batch_size
from edgeserve.engine.draft_sizing import DraftSizer
from edgeserve.engine.jobs import (
    EMBED_CHUNK,
    EMBED_MAX_SEQS,
    Choice,
    EmbedJob,
    Job,
    JobState,
    MediaSpan,
    ScoreJob,
)
from edgeserve.engine.ports import CHUNK_ALIGN, Batch, DecodeLimits, EmbedSpan
from edgeserve.engine.scoring import TextState
from edgeserve.engine.speculation import STEP_ROWS
from edgeserve.engine.step_cost import StepCost
from edgeserve.engine.types import AdapterSet, EngineConfig

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

    @property
    def adapters(self) -> AdapterSet:
        """The adapter set the step runs under (its job's)."""
        return self.job.request.adapters


@dataclass
class GenerationPlan:
    """A generation step: which batch rows to sample for which choice (the first row, then one
    per drafted token after it), which prompts advance."""

    rows: list[tuple[int, Job, Choice, tuple[int, ...]]] = field(default_factory=list)
    # (job, prompt tokens taken, batch row of the prompt's last token when this chunk ends it)
    prefills: list[tuple[Job, int, int | None]] = field(default_factory=list)
    adapters: AdapterSet = ()  # the adapter set of every job in the step
    # Kept as rows and prefills are added (`add_row`, `add_prefill`): the step's decode is
    # recorded with them right after it returns, when every object it reads is out of cache.
    logit_rows: int = 0  # the rows this step asks logits for (next tokens and drafts)
    ending_prompts: int = 0  # prompts whose last token is in this step (a logit row each)
    prompt_tokens: int = 0  # the prompt tokens of this step that give no logit row

    def add_row(self, row: int, job: Job, choice: Choice, draft: tuple[int, ...]) -> None:
        """Sample batch row `row` (and a row per drafted token after it) for `choice`."""
        self.rows.append((row, job, choice, draft))
        self.logit_rows += 1 + len(draft)

    def add_prefill(self, job: Job, take: int, row: int | None) -> None:
        """`take` more tokens of `job`'s prompt; `row`: its last token's, when they end it."""
        self.prefills.append((job, take, row))
        ending = row is not None
        self.ending_prompts += ending
        self.prompt_tokens += take - ending

    @property
    def routine(self) -> bool:
        """True for a step without prompt tokens: it gives each of its choices its next
        token (and verifies their drafts, which `Scheduler.keep` then cuts)."""
        return not self.prefills


@dataclass
class MediaPlan:
    """A media step: one image's or clip's embeddings into `job`'s lead sequence."""

    job: Job
    span: MediaSpan

    @property
    def adapters(self) -> AdapterSet:
        """The adapter set the step runs under (its job's)."""
        return self.job.request.adapters


@dataclass
class ScorePlan:
    """A score step: `take` tokens of `text` from `start`, or (classifier) the whole text."""

    job: ScoreJob
    text: TextState
    start: int
    take: int
    outputs: list[int]

    @property
    def adapters(self) -> AdapterSet:
        """The adapter set the step runs under (its job's)."""
        return self.job.request.adapters


class Planner:
    """Plans each step from the scheduler's live jobs; owns the measured step costs."""

    def __init__(
        self,
        *,
        n_ctx: int,
        prefill_chunk: int,
        draft_max: int,
        draft_model: DraftModel | None,
        checkpoint_spacing: int = 0,
        offloaded: bool = False,
    ) -> None:
        self.n_ctx = n_ctx
        self.checkpoint_spacing = checkpoint_spacing
        self.prefill_chunk = max(1, prefill_chunk)
        self.draft_sizer = DraftSizer(n_ctx, draft_max, draft_model, offloaded)
        self.step_cost = StepCost()
        self.adapter_turns = AdapterTurns()
        self._score_turn = True
        self._media_turn = True

    def plan(
        self, batch: Batch, active: list[Job], scoring: list[ScoreJob | EmbedJob]
    ) -> GenerationPlan | MediaPlan | ScorePlan | EmbedPlan | None:
        """The next step for the `active` generations and the `scoring` jobs: a score chunk,
        embeddings, a prompt's media item or a generation batch (written into `batch`),
        alternating when several wait; None when there is nothing to decode."""
        batch.clear()
        if scoring and (not active or self._score_turn):
            self._score_turn = False
            job = scoring[0]
            if isinstance(job, EmbedJob):
                budget = EMBED_CHUNK_BESIDE_STREAMS if active else EMBED_CHUNK
                return EmbedPlan(job, job.next_spans(budget))
            return self._plan_score(job, beside_streams=bool(active))
        self._score_turn = True
        streams = any(job.state is JobState.GENERATING for job in active)
        active = self.adapter_turns.next_group(active)
        media: MediaPlan | None = None
        tokens = False
        for job in active:
            span = _media_next(job)
            if span is None:
                tokens = tokens or job.steppable
            elif media is None:
                media = MediaPlan(job, span)
        if media is not None and (self._media_turn or not tokens):
            self._media_turn = False
            return media
        self._media_turn = True
        if not tokens:
            return None
        return self._plan_generation(batch, active, streams)

    def _plan_score(self, job: ScoreJob, *, beside_streams: bool) -> ScorePlan:
        text = job.current_text()
        if text is None:  # nothing left to score (empty texts): the job just completes
            return ScorePlan(job, TextState([]), 0, 0, [])
        if text.classify:
            return ScorePlan(job, text, 0, len(text.tokens), [])
        chunk = SCORE_CHUNK_BESIDE_STREAMS if beside_streams else SCORE_CHUNK
        take = min(len(text.tokens) - text.fed, chunk)
        return ScorePlan(job, text, text.fed, take, text.outputs_in(text.fed, take))

    def _plan_generation(self, batch: Batch, active: list[Job], streams: bool) -> GenerationPlan:
        """A generation step for `active`, the jobs of one adapter set; `streams` when any
        answer is being generated (under any set): prompts then take a share of the step."""
        plan = GenerationPlan(adapters=active[0].request.adapters)
        prefilling: list[Job] = []
        stepping: list[tuple[Job, Choice]] = []
        for job in active:
            if job.state is JobState.PREFILLING:
                prefilling.append(job)
                continue
            stepping += [(job, c) for c in job.choices if not c.done and c.pending is None]
        drafts = self.draft_sizer.drafts(stepping, batch.room - len(stepping) - 1, self.step_cost)
        for (job, choice), draft in zip(stepping, drafts, strict=True):
            row = batch.add(choice.last_token, choice.n_past, choice.seq_id, True)
            if draft:
                batch.add_span(draft, choice.n_past + 1, choice.seq_id, range(len(draft)))
            plan.add_row(row, job, choice, tuple(draft))
        if not prefilling:
            return plan
        prefilling = _tails_first(prefilling)
        budget = batch.room
        row_tokens = 0
        if streams:
            budget = min(budget, self._prefill_budget(plan.logit_rows))
            row_tokens = self._row_in_prompt_tokens()
        # Alone in the engine, a prompt's last token (whose row gives the first answer token)
        # is decoded in a step of its own (with the few before it that Prompt.tail adds), as
        # it is after a prefix-cache hit: llama.cpp's CPU kernels give a row different values
        # inside a multi-row chunk, so a cold prompt would otherwise answer differently from
        # the same prompt found in the cache. Beside other work the batch varies anyway, and
        # the extra step would only delay first tokens. A short question after an image is
        # decoded whole, cached or not (Prompt.short_tail).
        quiet = not streams and len(prefilling) == 1
        for job in prefilling:
            end = job.prompt.text_end(job.prefilled)
            left = end - job.prefilled
            if left == 0:  # a media item is next: it takes a media step
                continue
            alone = quiet and end == len(job.tokens) and job.prompt.short_tail is None
            tail = job.prompt.tail if alone else 0
            take = min(batch.room, budget, left - tail if left > tail else left)
            spacing = self.checkpoint_spacing
            if spacing and not _in_short_tail(job):  # a chunk ends where a checkpoint goes
                take = min(take, spacing - job.prefilled % spacing)
                if (mark := job.prompt.next_mark(job.prefilled)) is not None:
                    take = min(take, mark - job.prefilled)
            if quiet and job.prefilled + take < end - tail:  # the next chunk starts aligned
                aligned = job.prefilled + take - (job.prefilled + take) % CHUNK_ALIGN
                take = aligned - job.prefilled if aligned > job.prefilled else take
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
            plan.add_prefill(job, take, start + take - 1 if last else None)
        return plan

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


class AdapterTurns:
    """Which adapter set's jobs the next generation or media step serves: the one after the
    last served, in a fixed order of the sets that have something to decode (see the module
    docstring)."""

    def __init__(self) -> None:
        self._last: AdapterSet | None = None

    def next_group(self, active: Sequence[Job]) -> list[Job]:
        """The jobs of `active` (in order) under the set whose turn it is: every job when all
        run under one set."""
        sets = {job.request.adapters for job in active}
        if len(sets) == 1:  # one set (the common case): every job, if any has work
            self._last = sets.pop() if any(job.steppable for job in active) else None
            return list(active) if self._last is not None else []
        ready = sorted({job.request.adapters for job in active if job.steppable})
        if len(ready) <= 1:
            self._last = ready[0] if ready else None
            return [job for job in active if job.request.adapters == self._last]
        later = [adapters for adapters in ready if self._last is None or adapters > self._last]
        self._last = later[0] if later else ready[0]
        return [job for job in active if job.request.adapters == self._last]


def _tails_first(prefilling: list[Job]) -> list[Job]:
    """The prompts a step advances, in the order they take its budget: those with only
    their last tokens (Prompt.tail) left first, as they were found in the prefix cache or
    decoded before others joined, then the rest in arrival order."""
    return sorted(prefilling, key=lambda job: job.prefilled < job.prompt.tail_start)


def _in_short_tail(job: Job) -> bool:
    """Whether a job's prefill is at the short text after its last media item, which is
    decoded in one chunk (Prompt.short_tail)."""
    tail = job.prompt.short_tail
    return tail is not None and job.prefilled >= tail


def _media_next(job: Job) -> MediaSpan | None:
    """The media item a prefilling job decodes next, when its next position starts one."""
    if job.state is not JobState.PREFILLING:
        return None
    return job.prompt.media_at(job.prefilled)
