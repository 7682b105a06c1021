"""How many tokens each generating sequence drafts in a step (speculation.py: n-gram lookups;
draft_model.py: a second model's greedy tokens), at most `--draft-max` each.

Once the step costs are measured (`StepCost`, step_cost.py), n-gram drafts take the lengths
that give the step the most expected tokens per second (`speculation.best_lengths`), within
the pace every sequence of the step is owed: drafts may make the step (every stream's gap
between two tokens) at most DRAFT_SHARE longer, unless a greedy stream is alone (it drafts
what pays: greedy answers are the ones that copy their input for long stretches, and a
reader alone takes a burst of tokens after a longer gap as a gain). When every stream of the
step is greedy, the bound stretches by the fewest tokens any of them expects from the step:
each one's own rate stays within the share of its plain pace (streams that all copy draft
together; one that drafts nothing keeps the plain bound for all). A draft model's drafts,
n-gram drafts before the costs are known, and a seeded sampled answer's drafts take the
positions whose chance of being kept is above a threshold instead. Where no number of
drafted rows would keep a step held to DRAFT_SHARE within it (a sampled stream on a small
CPU, every step), the step looks nothing up, and a prompt's n-gram index is not built until
a step could draft from it (`StepCost.cheapest` bounds every size at once).

Pure bookkeeping (no llama.cpp import, no threads), like the planner that owns it.
"""

from __future__ import annotations

from edgeserve.engine.draft_model import DraftModel, DraftWant
from edgeserve.engine.jobs import Choice, Job
from edgeserve.engine.speculation import (
    STEP_ROWS,
    Drafter,
    DraftPace,
    best_lengths,
    draft_room,
    keeps_pace,
)
from edgeserve.engine.step_cost import PRIOR_THRESHOLD, StepCost

# Drafts may make a step at most this share longer than it is without them
# (`speculation.keeps_pace`; a greedy stream alone excepted, greedy streams together held
# by their own rates), so every stream's gap between two tokens stays within 15% of its
# plain pace: PRODUCT.md holds inter-token p99 to llama-server's, whose gaps are about 15%
# above a plain step here. On a GPU a row costs little of a step and every stream drafts; on
# a small CPU, where 8 rows cost 39% more than 4 and one more row 30% more than one, only
# greedy streams draft (alone, or all of a step's streams copying).
DRAFT_SHARE = 0.15
# A step is taken to cost at least this much (a measured 0 would make any draft free).
MIN_STEP_SECONDS = 1e-6

# (batch index of the choice in the step, its job, the choice, the most it may draft)
Drafting = list[tuple[int, Job, Choice, int]]


class DraftSizer:
    """Decides each step's drafts (see the module docstring)."""

    def __init__(
        self, n_ctx: int, draft_max: int, draft_model: DraftModel | None, offloaded: bool
    ) -> None:
        self.n_ctx = n_ctx
        self.draft_max = draft_max
        self.draft_model = draft_model  # drafts in place of n-gram lookups when set
        self.offloaded = offloaded  # the model's layers run on a GPU: a row costs little

    def drafts(
        self, stepping: list[tuple[Job, Choice]], spare: int, cost: StepCost
    ) -> list[list[int]]:
        """The tokens each stepping choice drafts this step, in order (see speculation.py),
        at most `spare` in all (the batch's room): none for a grammar's detached sampler or
        (with a draft model) a prompt with media, and never past `draft_max`, the answer's
        token limit or the context. N-gram drafts take the lengths that pay best once a
        row's cost is measured (`_best_ngram_drafts`); a draft model's, or n-gram drafts
        before that, the positions above the threshold (`_threshold_drafts`)."""
        drafts: list[list[int]] = [[] for _ in stepping]
        if self.draft_max <= 0 or not stepping:
            return drafts
        sequences = len(stepping)
        greedy = all(job.request.params.greedy for job, _ in stepping)
        share = None if sequences == 1 and greedy else DRAFT_SHARE
        measured = self.draft_model is None and cost.line() is not None
        held: bool | None = None if measured and not greedy else False  # worked out once
        drafting: Drafting = []
        for i, (job, choice) in enumerate(stepping):
            if choice.sampler.detached:
                continue
            seeded = job.request.params.seeded
            if seeded and not self.offloaded:
                continue  # see below
            if not seeded and held is None:
                held = self._pace_holds_back(cost, sequences, spare)
            if held and not seeded:
                continue  # no n-gram draft keeps this step's pace: no lookup either
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
        # A seeded sampled answer drafts by its own acceptance against the prior threshold,
        # not by the measured costs, which change with whatever else ran: llama.cpp gives a
        # row slightly different values in a batch of another shape, so the same seed would
        # otherwise sample differently from run to run. Without the costs its drafts cannot
        # be held to its pace, so it drafts only where rows are cheap by construction (the
        # model on a GPU) and not at all on the CPU.
        seeded = [entry for entry in drafting if entry[1].request.params.seeded]
        if seeded:
            drafting = [entry for entry in drafting if not entry[1].request.params.seeded]
            spare -= self._threshold_drafts(drafts, seeded, sequences, spare, cost, PRIOR_THRESHOLD)
        if not drafting:
            return drafts
        if measured:
            most = min(spare, STEP_ROWS)
            self._best_ngram_drafts(drafts, drafting, sequences, most, cost, share, greedy)
        else:
            spare = min(spare, self._paced_rows(cost, sequences, share))
            self._threshold_drafts(drafts, drafting, sequences, spare, cost)
        return drafts

    @staticmethod
    def _pace_holds_back(cost: StepCost, sequences: int, spare: int) -> bool:
        """Whether no step of `sequences` next tokens and 1 to `spare` drafted rows (at most
        STEP_ROWS) keeps the pace `keeps_pace` holds a step with a sampled stream to: then
        `_best_ngram_drafts` would draft nothing and a probe would be taken back, so the
        lookups are skipped (on a small CPU, every step of a sampled answer)."""
        most = min(spare, STEP_ROWS)
        if most <= 0:
            return True
        plain = max(MIN_STEP_SECONDS, cost.generation_seconds(sequences) or 0.0)
        bound = (1.0 + DRAFT_SHARE) * plain
        least = max(MIN_STEP_SECONDS, cost.cheapest(sequences + 1, sequences + most))
        return least > bound

    def _best_ngram_drafts(
        self,
        drafts: list[list[int]],
        drafting: Drafting,
        sequences: int,
        most: int,
        cost: StepCost,
        share: float | None,
        by_gain: bool,
    ) -> None:
        """Fill `drafts` with the n-gram drafts of the lengths that give the step the most
        expected tokens per second (`speculation.best_lengths`, from each sequence's
        acceptance and the measured step costs; `by_gain` when every stream is greedy,
        see the module docstring); a sequence none of whose tokens pay
        probes now and then (`DraftPace.settle`), while the step stays within the limit
        that protects the others' pace."""

        def step_seconds(rows: int) -> float:
            return max(MIN_STEP_SECONDS, cost.generation_seconds(rows) or 0.0)

        candidates: dict[int, list[int]] = {}
        chances: list[list[float]] = [[] for _ in range(sequences)]
        for i, _, choice, limit in drafting:
            assert isinstance(choice.drafter, Drafter)
            candidates[i] = choice.drafter.lookup(choice.generated, limit)
            chances[i] = choice.drafter.chances(len(candidates[i]))
        lengths = best_lengths(chances, step_seconds, most, share, by_gain)
        for i, _, choice, _ in drafting:
            assert isinstance(choice.drafter, Drafter)
            chosen = lengths[i]
            lengths[i] = choice.drafter.settle(len(candidates[i]), chosen)
            if lengths[i] > chosen and (
                sum(lengths) > most or not keeps_pace(lengths, step_seconds, share)
            ):
                lengths[i] = chosen  # no room for the probe this step
            drafts[i] = candidates[i][: lengths[i]]

    def _threshold_drafts(
        self,
        drafts: list[list[int]],
        drafting: Drafting,
        sequences: int,
        spare: int,
        cost: StepCost,
        threshold: float | None = None,
    ) -> int:
        """Fill `drafts` with each sequence's positions whose chance of being kept is above
        `threshold` (by default `StepCost.threshold`, raised by a draft model's own cost), at
        most `draft_room` each and `spare` in all; a draft model is asked once for all of
        them. Returns the tokens drafted."""
        room = draft_room(sequences, self.draft_max)
        given = threshold
        threshold = cost.threshold(sequences) if given is None else given
        if self.draft_model is not None:
            step_s = cost.generation_seconds(max(1, sequences))
            threshold += self.draft_model.step_share(step_s)
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

    def _paced_rows(self, cost: StepCost, sequences: int, share: float | None) -> int:
        """Drafted rows a step of `sequences` next tokens may carry in all: what pays, for
        a greedy stream alone (`share` None); otherwise what adds at most `share` to the
        step (each row delays every stream's next token). Unbounded until a row's cost is
        measured."""
        per_row = cost.row_seconds()
        step = cost.generation_seconds(sequences)
        if share is None or per_row <= 0.0 or step is None:
            return STEP_ROWS
        return int(share * step / per_row)
