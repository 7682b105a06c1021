"""Logit-based scoring: per-text state and the log-softmax of one logit row.

A text's tokens are t0 … tL-1 (t0 is BOS when the model adds one). Row p of the model's output
predicts t(p+1), so rows 0 … L-2 are requested and each is reduced at once to
log p(t(p+1) | t0 … tp): nothing of size n_tokens × n_vocab is ever held. Without BOS the first
token has nothing to be predicted from and is not scored. A text with no scored token (empty,
or one token without BOS) scores 0.0: the log-probability of an empty continuation.

A classifier / reranker model instead reads the whole text at once, and its one "log-prob" is
the head's first output logit, so mean and sum are that logit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgeserve.engine.types import TokenLogprob


class LogSoftmax:
    """Reduces logit rows of one vocabulary size to log-probabilities.

    One scratch row is reused, so a reduction allocates nothing (allocating two n_vocab
    temporaries per row cost more than half of the reduction's time). Max subtraction, exp in
    float32, the sum in float64. Not thread-safe: the engine thread owns it.
    """

    def __init__(self, n_vocab: int) -> None:
        self._scratch = np.empty(n_vocab, dtype=np.float32)

    def logsumexp(self, row: np.ndarray) -> float:
        """log(sum(exp(row)))."""
        peak = row.max()
        np.subtract(row, peak, out=self._scratch)
        np.exp(self._scratch, out=self._scratch)
        return float(peak) + math.log(float(self._scratch.sum(dtype=np.float64)))

    def logprob(self, row: np.ndarray, target: int) -> float:
        """log softmax(row)[target]."""
        return float(row[target]) - self.logsumexp(row)

    def describe(
        self, row: np.ndarray, index: int, token: int, top_n: int, piece: Callable[[int], bytes]
    ) -> TokenLogprob:
        """`token`'s log-probability from a raw logit row, read in place (no copy of the row),
        and the `top_n` most likely tokens; `piece` gives a token's bytes."""
        lse = self.logsumexp(row)
        top: tuple[tuple[bytes, float], ...] = ()
        if top_n > 0:
            best = np.argpartition(row, -top_n)[-top_n:]
            best = best[np.argsort(row[best])[::-1]]
            top = tuple((piece(int(t)), float(row[t]) - lse) for t in best)
        return TokenLogprob(index, piece(token), float(row[token]) - lse, top)


@dataclass(eq=False)
class TextState:
    """One text of a score request while it is being decoded. `own_first`: its first token is
    the text's own (a token prompt, or a model that adds no BOS), not a BOS added to it."""

    tokens: list[int]
    classify: bool = False
    own_first: bool = False
    fed: int = 0
    logprobs: list[float] = field(default_factory=list)
    details: list[TokenLogprob] = field(default_factory=list)

    @property
    def n_rows(self) -> int:
        """Rows that predict a scored token (for a classifier: 1, the pooled head)."""
        if self.classify:
            return 1 if self.tokens else 0
        return max(0, len(self.tokens) - 1)

    def outputs_in(self, start: int, count: int) -> list[int]:
        """Offsets within the chunk [start, start+count) whose rows are needed."""
        last_row = len(self.tokens) - 2
        return [i for i in range(count) if start + i <= last_row]
