"""What goes into the next decode: a score chunk, embeddings, or a generation step.

Each generation step is ONE decode holding the next token of every generating choice plus
chunks of waiting prompts (a prompt alone in the engine decodes its last token in a chunk of its
own, see `_plan_generation`; with sliding-window checkpoints, chunks also end at their
positions, see checkpoints.py): up to the batch's room while nothing generates, else as many
prompt tokens as keep the step within (1 + PREFILL_SHARE) times what it costs without them
(`StepCost`, measured), and at least `prefill_chunk`: a newcomer's prefill holds running
streams for about one more step's time per step instead of for its whole prompt. Drafted
tokens (speculation.py, draft_model.py) ride in the same decode, within DRAFT_SHARE of it
beside other streams.
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

from edgeserve.engine.draft_model import DraftModel, DraftWant, batch_size
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
from edgeserve.engine.ports import Batch, DecodeLimits, EmbedSpan
from edgeserve.engine.scoring import TextState
from edgeserve.engine.speculation import (
    STEP_ROWS,
    Drafter,
    DraftPace,
    best_lengths,
    draft_room,
    keeps_pace,
)
from edgeserve.engine.step_cost import PRIOR_THRESHOLD, StepCost
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
# Beside other streams, drafts may slow a stream's expected tokens per second by at most this
# share (`speculation.keeps_pace`): a stream that drafts nothing gets its next token at most
# twice as late, while streams that copy (and keep most of what they draft) may draft long.
DRAFT_SHARE = 1.0
# A step is taken to cost at least this much (a measured 0 would make any draft free).
MIN_STEP_SECONDS = 1e-6


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
    ) -> None:
        self.n_ctx = n_ctx
        self.checkpoint_spacing = checkpoint_spacing
        self.prefill_chunk = max(1, prefill_chunk)
        self.draft_max = draft_max
        self.draft_model = draft_model  # drafts in place of n-gram lookups when set
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
        media = [(job, span) for job in active if (span := _media_next(job)) is not None]
        tokens = any(job.steppable and _media_next(job) is None for job in active)
        if media and (self._media_turn or not tokens):
            self._media_turn = False
            return MediaPlan(*media[0])
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
        drafts = self._drafts(stepping, batch.room - len(stepping) - 1)
        for (job, choice), draft in zip(stepping, drafts, strict=True):
            row = batch.add(choice.last_token, choice.n_past, choice.seq_id, True)
            if draft:
                batch.add_span(draft, choice.n_past + 1, choice.seq_id, range(len(draft)))
            plan.rows.append((row, job, choice, tuple(draft)))
        budget = batch.room
        row_tokens = 0
        if streams:
            budget = min(budget, self._prefill_budget(plan.logit_rows))
            row_tokens = self._row_in_prompt_tokens()
        # Alone in the engine, a prompt's last token (whose row gives the first answer token)
        # is decoded in a step of its own, as it is after a prefix-cache hit: llama.cpp's CPU
        # kernels give a row different values inside a multi-row chunk, so a cold prompt would
        # otherwise answer differently from the same prompt found in the cache. Beside other
        # work the batch varies anyway, and the extra step would only delay first tokens. A
        # short question after an image is decoded whole, cached or not (Prompt.short_tail).
        quiet = not streams and len(prefilling) == 1
        for job in prefilling:
            end = job.prompt.text_end(job.prefilled)
            left = end - job.prefilled
            if left == 0:  # a media item is next: it takes a media step
                continue
            alone = quiet and end == len(job.tokens) and job.prompt.short_tail is None
            take = min(batch.room, budget, left - 1 if alone and left > 1 else left)
            spacing = self.checkpoint_spacing
            if spacing and not _in_short_tail(job):  # a chunk ends where a checkpoint goes
                take = min(take, spacing - job.prefilled % spacing)
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

    def _drafts(self, stepping: list[tuple[Job, Choice]], spare: int) -> list[list[int]]:
        """The tokens each stepping choice drafts this step, in order (see speculation.py),
        at most `spare` in all (the batch's room): none for a grammar's detached sampler or
        (with a draft model) a prompt with media, and never past `draft_max`, the answer's
        token limit or the context. N-gram drafts take the lengths that pay best once a
        row's cost is measured (`_best_ngram_drafts`); a draft model's, or n-gram drafts
        before that, the positions above the threshold (`_threshold_drafts`)."""
        drafts: list[list[int]] = [[] for _ in stepping]
        drafting: list[tuple[int, Job, Choice, int]] = []
        for i, (job, choice) in enumerate(stepping):
            if self.draft_max <= 0 or choice.sampler.detached:
                continue
            if self.draft_model is not None and job.prompt.media:
                continue  # the draft model reads tokens; a media item has none
            if choice.drafter is None:
                choice.drafter = DraftPace() if self.draft_model else Drafter(job.tokens)
            limit = min(
                self.draft_max,
                job.prompt.max_new - choice.n_gen - 1,
                self.n_ctx - choice.n_past - 2,
            )
            drafting.append((i, job, choice, limit))
        if not drafting:
            return drafts
        sequences = len(stepping)
        # A seeded sampled answer drafts by its own acceptance against the prior threshold,
        # not by the measured costs, which change with whatever else ran: llama.cpp gives a
        # row slightly different values in a batch of another shape, so the same seed would
        # otherwise sample differently from run to run.
        seeded = [entry for entry in drafting if entry[1].request.params.seeded]
        if seeded:
            drafting = [entry for entry in drafting if not entry[1].request.params.seeded]
            spare -= self._threshold_drafts(drafts, seeded, sequences, spare, PRIOR_THRESHOLD)
        if self.draft_model is None and self.step_cost.line() is not None:
            self._best_ngram_drafts(drafts, drafting, sequences, min(spare, STEP_ROWS))
        else:
            self._threshold_drafts(drafts, drafting, sequences, spare)
        return drafts

    def _best_ngram_drafts(
        self,
        drafts: list[list[int]],
        drafting: list[tuple[int, Job, Choice, int]],
        sequences: int,
        most: int,
    ) -> None:
        """Fill `drafts` with the n-gram drafts of the lengths that give the step the most
        expected tokens per second (`speculation.best_lengths`, from each sequence's
        acceptance and the measured step costs); a sequence none of whose tokens pay
        probes now and then (`DraftPace.settle`), while the step stays within the limit
        that protects the others' pace."""
        cost = self.step_cost

        def step_seconds(rows: int) -> float:
            return max(MIN_STEP_SECONDS, cost.generation_seconds(rows) or 0.0)

        candidates: dict[int, list[int]] = {}
        chances: list[list[float]] = [[] for _ in range(sequences)]
        for i, _, choice, limit in drafting:
            assert isinstance(choice.drafter, Drafter)
            candidates[i] = choice.drafter.lookup(choice.generated, limit)
            chances[i] = choice.drafter.chances(len(candidates[i]))
        lengths = best_lengths(chances, step_seconds, most, DRAFT_SHARE)
        for i, _, choice, _ in drafting:
            assert isinstance(choice.drafter, Drafter)
            chosen = lengths[i]
            lengths[i] = choice.drafter.settle(len(candidates[i]), chosen)
            if lengths[i] > chosen and (
                sum(lengths) > most or not keeps_pace(lengths, chances, step_seconds, DRAFT_SHARE)
            ):
                lengths[i] = chosen  # no room for the probe this step
            drafts[i] = candidates[i][: lengths[i]]

    def _threshold_drafts(
        self,
        drafts: list[list[int]],
        drafting: list[tuple[int, Job, Choice, int]],
        sequences: int,
        spare: int,
        threshold: float | None = None,
    ) -> int:
        """Fill `drafts` with each sequence's positions whose chance of being kept is above
        `threshold` (by default `StepCost.threshold`, raised by a draft model's own cost), at
        most `draft_room` each and, beside other streams, DRAFT_SHARE of the step in all; a
        draft model is asked once for all of them. Returns the tokens drafted."""
        room = draft_room(sequences, self.draft_max)
        given = threshold
        threshold = self.step_cost.threshold(sequences) if given is None else given
        if self.draft_model is not None:
            step_s = self.step_cost.generation_seconds(max(1, sequences))
            threshold += self.draft_model.step_share(step_s)
        if given is None:
            spare = min(spare, self._draft_rows_beside(sequences))
        drafted = 0
        wants: list[tuple[int, DraftWant]] = []
        for i, job, choice, limit in drafting:
            assert choice.drafter is not None
            limit = min(limit, room, spare)
            if isinstance(choice.drafter, Drafter):
                drafts[i] = choice.drafter.draft(choice.generated, limit, threshold)
                spare -= len(drafts[i])
                drafted += len(drafts[i])
            elif k := choice.drafter.want(limit, threshold):
                wants.append((i, DraftWant(choice.seq_id, job.tokens + choice.generated, k)))
                spare -= k
                drafted += k
        if wants and self.draft_model is not None:
            made = self.draft_model.draft([want for _, want in wants])
            for (i, _), draft in zip(wants, made, strict=True):
                drafts[i] = draft
        return drafted


class AdapterTurns:
    """Which adapter set's jobs the next generation or media step serves: the one after the
    last served, in a fixed order of the sets that have something to decode (see the module
    docstring)."""

    def __init__(self) -> None:
        self._last: AdapterSet | None = None

    def next_group(self, active: Sequence[Job]) -> list[Job]:
        """The jobs of `active` (in order) under the set whose turn it is: every job when all
        run under one set."""
        ready = sorted({job.request.adapters for job in active if job.steppable})
        if len(ready) <= 1:
            self._last = ready[0] if ready else None
            return [job for job in active if job.request.adapters == self._last]
        later = [adapters for adapters in ready if self._last is None or adapters > self._last]
        self._last = later[0] if later else ready[0]
        return [job for job in active if job.request.adapters == self._last]


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
