"""Draftless speculative decoding: n-gram drafts from a sequence's own prompt and answer.

When the last few tokens of a sequence occurred before (in its prompt or its answer so far),
the tokens that followed them then are a likely continuation now: rewriting, quoting,
extracting and code edits repeat long stretches of their input. Those tokens are decoded as a
draft in the same `llama_decode` as the sequence's next token, each with a logit row; the
engine then samples the rows in order with the sequence's own sampler and keeps a drafted token
only while the sampled token equals it, so the answer is the one the sampler would have made
one token per step (the rejected drafts' cells are removed from the KV cache).

Whether a draft pays depends on the hardware, so the engine measures it (`StepCost`, in
step_cost.py: what a step of each number of logit rows costs). Each sequence estimates how
likely its next drafted token is to be kept (`DraftPace.acceptance`, from its recent drafts),
so its k-th drafted token is kept with that chance to the power k; each step drafts the
lengths that give it the most expected tokens per second (`best_lengths`), within the pace
every sequence of the step is owed (`keeps_pace`). On a GPU an extra logit row costs a small
share of a step and long drafts pay even when half of them is kept; on a small CPU one row is
a vector product and several a matrix one (Gemma 3 270M on 2 AVX2 cores: 17 ms for one row,
44 for four, 83 for sixteen), so a greedy stream alone drafts only when it copies, and then
long, while a sampled one, held to its pace, does not draft there. A sequence whose drafts do
not pay drafts a short probe after a growing wait, to notice when its answer starts copying.
Before the costs are measured (and for a draft model, whose own cost adds to each position's),
a sequence drafts the positions whose chance of being kept is above the share of the step one
more row costs (`DraftPace.length`, `StepCost.threshold`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

# Tail lengths looked up, longest first: a longer match is a better predictor.
NGRAM_SIZES = (4, 3, 2)
# Logit rows a generation step may hold for drafts and next tokens together.
STEP_ROWS = 32
# Tokens drafted by a sequence whose drafts do not pay, once its wait is over.
PROBE_LENGTH = 2
# The longest wait, in steps, before such a sequence probes again.
MAX_BACKOFF = 64
# A new sequence's belief about its drafts: KEPT tokens kept for MISSED rejections.
PRIOR_KEPT = 3.0
PRIOR_MISSED = 1.0
# Weight left to earlier drafts at each verification (recent drafts count most).
DRAFT_MEMORY = 0.8


def draft_room(generating_rows: int, draft_max: int) -> int:
    """The most tokens each of `generating_rows` sequences may draft this step."""
    if generating_rows <= 0:
        return 0
    return max(0, min(draft_max, STEP_ROWS // generating_rows - 1))


class NgramIndex:
    """A token history and, for each n-gram size, where each n-gram last ended."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}
        # Per size: where the history's current tail occurred before (None: never).
        self._previous: dict[int, int | None] = dict.fromkeys(NGRAM_SIZES)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the history."""
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1
            for n in NGRAM_SIZES:
                if end + 1 >= n:
                    key = tuple(self.tokens[end + 1 - n :])
                    self._previous[n] = self._last.get(key)
                    self._last[key] = end

    def continuation(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the history's
        longest repeated tail ([] when no tail of NGRAM_SIZES occurred before), up to the
        first media position (a negative stand-in id, never a token to draft)."""
        for n in NGRAM_SIZES:
            end = self._previous[n]
            if end is not None:
                following = self.tokens[end + 1 : end + 1 + k]
                tokens = next((i for i, t in enumerate(following) if t < 0), len(following))
                return following[:tokens]
        return []


class DraftPace:
    """How much one sequence drafts, whatever makes its drafts (n-gram lookups here, or a
    draft model, see draft_model.py): how often its drafted tokens were kept, and the wait
    before its next probe while none pay."""

    def __init__(self) -> None:
        self._kept = PRIOR_KEPT
        self._missed = PRIOR_MISSED
        self._wait = 0
        self._backoff = 1
        self.drafted = 0
        self.accepted = 0

    @property
    def acceptance(self) -> float:
        """The estimated chance that a drafted token is kept, given the one before it was
        (the tokens kept for each rejection, over the recent drafts)."""
        return self._kept / (self._kept + self._missed)

    def length(self, threshold: float) -> int:
        """How many tokens pay at `threshold`: the positions whose chance of being reached
        and kept (acceptance to the power of the position) is above it."""
        a = self.acceptance
        if a <= threshold:
            return 0
        if threshold <= 0.0 or a >= 1.0:
            return STEP_ROWS
        return min(STEP_ROWS, math.floor(math.log(threshold) / math.log(a)))

    def want(self, room: int, threshold: float) -> int:
        """How many tokens to draft this step: at most `room`, as many as pay at `threshold`
        (`StepCost.threshold`), or a short probe now and then when none pay."""
        if room <= 0:
            return 0
        return self.settle(room, self.length(threshold))

    def chances(self, k: int) -> list[float]:
        """The chance that each of `k` drafted positions is reached and kept."""
        a = self.acceptance
        return [a**j for j in range(1, k + 1)]

    def settle(self, room: int, length: int) -> int:
        """How many tokens to draft, given that `length` of them pay: those (at most `room`),
        or when none pay, a probe of PROBE_LENGTH once a wait that doubles with each probe
        (up to MAX_BACKOFF steps) is over; none while it runs."""
        if room <= 0:
            return 0
        if length > 0:
            self._backoff = 1
        elif self._wait > 0:
            self._wait -= 1
            return 0
        else:
            length = PROBE_LENGTH
            self._wait = self._backoff
            self._backoff = min(2 * self._backoff, MAX_BACKOFF)
        return min(room, length)

    def adapt(self, drafted: int, accepted: int) -> None:
        """Learn from a verified draft: `accepted` of its `drafted` tokens were kept. (The
        engine counts `drafted` and `accepted` as it verifies.)"""
        self._kept = DRAFT_MEMORY * self._kept + accepted
        self._missed = DRAFT_MEMORY * self._missed + (1.0 if accepted < drafted else 0.0)


class Drafter(DraftPace):
    """One sequence's n-gram drafts: its index, drafted at the pace `DraftPace` sets."""

    def __init__(self, prompt: Sequence[int]) -> None:
        super().__init__()
        self.index = NgramIndex()
        self.index.extend(prompt)
        self._prompt_len = len(prompt)

    def draft(self, generated: Sequence[int], room: int, threshold: float) -> list[int]:
        """Tokens to verify after the sequence's next token (see `DraftPace.want`).
        `generated` is the answer so far."""
        return self.lookup(generated, self.want(room, threshold))

    def lookup(self, generated: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens the history (prompt and `generated`, the answer so far) repeats
        after its tail (see `NgramIndex.continuation`)."""
        seen = len(self.index.tokens) - self._prompt_len
        if seen < len(generated):
            self.index.extend(generated[seen:])
        return self.index.continuation(k)


def best_lengths(
    chances: Sequence[Sequence[float]],
    step_seconds: Callable[[int], float],
    most: int,
    share: float | None,
    by_gain: bool = False,
) -> list[int]:
    """How many of its candidate tokens each of a step's sequences drafts: the lengths that
    give the most expected tokens per second of the step, at most `most` in all, among those
    that keep every sequence's pace (`keeps_pace`; with `by_gain`, a pace stretched by the
    least expected gain among the sequences).

    `chances[i][j]` is the chance that sequence i's drafted token j is reached and kept (it
    falls with j, so each sequence drafts a prefix of its candidates); `step_seconds(rows)`
    is what a step of that many logit rows costs."""
    sequences = len(chances)
    # Likeliest first; at equal chances, each sequence's first token before anyone's second.
    ranked = sorted(
        ((p, j, i) for i, seq in enumerate(chances) for j, p in enumerate(seq)),
        key=lambda pji: (-pji[0], pji[1]),
    )[:most]
    lengths = [0] * sequences
    gains = [1.0] * sequences
    best, best_rate = [0] * sequences, sequences / step_seconds(sequences)
    for rows, (p, _, i) in enumerate(ranked, start=1):
        lengths[i] += 1
        gains[i] += p
        rate = sum(gains) / step_seconds(sequences + rows)
        least = min(gains) if by_gain else 1.0
        if rate > best_rate and keeps_pace(lengths, step_seconds, share, least):
            best, best_rate = list(lengths), rate
    return best


def keeps_pace(
    lengths: Sequence[int],
    step_seconds: Callable[[int], float],
    share: float | None,
    least_gain: float = 1.0,
) -> bool:
    """Whether drafts of `lengths` keep every sequence's pace: the step may take at most
    (1 + share) times as long as without drafts, so no stream's next token waits more than
    `share` longer for drafts (the gap between two tokens is what a reader of a stream sees,
    and what its 99th percentile is judged by, not only the mean rate). `least_gain`, the
    fewest tokens a sequence expects from the step (1 for one that drafts nothing), stretches
    that bound: every stream's own rate stays within `share` of its plain one. A `share` of
    None sets no bound (a greedy stream alone drafts what pays)."""
    if share is None:
        return True
    sequences = len(lengths)
    bound = (1.0 + share) * least_gain * step_seconds(sequences)
    return step_seconds(sequences + sum(lengths)) <= bound
