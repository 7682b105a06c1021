"""Draftless speculative decoding: n-gram drafts from a sequence's own prompt and answer.

When the last few tokens of a sequence occurred before (in its prompt or its answer so far),
the tokens that followed them then are a likely continuation now: rewriting, quoting,
extracting and code edits repeat long stretches of their input. Those tokens are decoded as a
draft in the same `llama_decode` as the sequence's next token, each with a logit row; the
engine then samples the rows in order with the sequence's own sampler and keeps a drafted token
only while the sampled token equals it, so the answer is the one the sampler would have made
one token per step (the rejected drafts' cells are removed from the KV cache).

What a draft costs depends on the hardware. On a CPU a small model's step is bound by reading
the weights: here (Gemma 3 270M, 2 cores) one row takes ~25 ms and any batch of 2 to 48 rows
~45 ms, so a draft costs nearly a whole step however long it is, and pays once it keeps about
one token. Each sequence therefore drafts long while its drafts are kept, and keeps a moving
average of the tokens its drafts kept: while that is below PAYOFF it waits a growing number
of steps between drafts (sampled free text keeps ~40% of drafted tokens, 0.5-1 a draft, which
does not pay for the step's extra ~20 ms). The scheduler
caps the rows of a step (`draft_room`), so drafts shrink as more sequences generate at once.
"""

from __future__ import annotations

from collections.abc import Sequence

# Tail lengths looked up, longest first: a longer match is a better predictor.
NGRAM_SIZES = (4, 3, 2)
# Logit rows a generation step may hold for drafts and next tokens together.
STEP_ROWS = 32
# A sequence's first draft length; it doubles while drafts are kept whole.
FIRST_LENGTH = 8
# The shortest draft after a partly kept one.
MIN_LENGTH = 4
# The longest wait, in steps, before a sequence whose drafts keep failing drafts again.
MAX_BACKOFF = 32
# Kept tokens per draft (moving average) below which a sequence waits between drafts.
PAYOFF = 1.5
# Weight of the latest draft in that average; a new sequence starts hopeful.
AVERAGE_WEIGHT = 0.3
FIRST_EXPECTATION = 4.0


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
        longest repeated tail ([] when no tail of NGRAM_SIZES occurred before)."""
        for n in NGRAM_SIZES:
            end = self._previous[n]
            if end is not None:
                return self.tokens[end + 1 : end + 1 + k]
        return []


class Drafter:
    """One sequence's drafts: its n-gram index and how well its drafts have done."""

    def __init__(self, prompt: Sequence[int]) -> None:
        self.index = NgramIndex()
        self.index.extend(prompt)
        self._prompt_len = len(prompt)
        self.length = FIRST_LENGTH
        self._wait = 0
        self._backoff = 1
        self.expected = FIRST_EXPECTATION
        self.drafted = 0
        self.accepted = 0

    def draft(self, generated: Sequence[int], room: int) -> list[int]:
        """Tokens to verify after the sequence's next token: at most `room` (none while
        waiting after failed drafts). `generated` is the answer so far."""
        seen = len(self.index.tokens) - self._prompt_len
        if seen < len(generated):
            self.index.extend(generated[seen:])
        if room <= 0:
            return []
        if self._wait > 0:
            self._wait -= 1
            return []
        return self.index.continuation(min(room, self.length))

    def adapt(self, drafted: int, accepted: int) -> None:
        """Learn from a verified draft: `accepted` of its `drafted` tokens were kept. (The
        engine counts `drafted` and `accepted` as it verifies.)"""
        if accepted == drafted:
            self.length = min(2 * self.length, STEP_ROWS)
        else:
            self.length = max(MIN_LENGTH, 2 * accepted)
        self.expected += AVERAGE_WEIGHT * (accepted - self.expected)
        if self.expected < PAYOFF:
            self._wait = self._backoff
            self._backoff = min(2 * self._backoff, MAX_BACKOFF)
        else:
            self._backoff = 1
