"""Exact sampling from one logit row, for sequences without top-k/top-p/min-p.

llama.cpp's sampler chain copies the whole row into a candidate array on every token and its
penalties, temperature and dist samplers each pass over all of it: ~3.4 ms a token on Gemma's
262,144-entry vocabulary, ~6.3 ms with penalties. `RowSampler` draws from the same
distribution (logit bias → penalties → temperature → softmax) in 30-200 µs on 2 cores:

- logit bias and penalties change only their own few ids of the row, and are undone after;
- the tokens within HEAD_GAP (in units of logit/T) of the best are the head. A small
  model's head is nearly its whole vocabulary (SmolLM2 at T = 0.7, deep into a sampled
  answer: 48k of 49k tokens), so the compiled draw (rowdraw.c) weighs every token, eight
  at a time: one pass finds each block's greatest logit and the row's best, a second weighs
  the tokens against the best and sums each block, skipping a block with no token in the
  head: ~40 µs a token on such rows on 2 cores (~60 with the caches flushed) where numpy took
  ~180 to find, gather and weigh the head (Gemma: ~160 against ~260).
  A uniform finds its block among the blocks' running sums, then its token in that block;
- every other token weighs under e^-HEAD_GAP of the best, so the rest of the vocabulary is
  covered by an envelope of (count · e^-HEAD_GAP). A uniform that lands there (at most
  262,144 · e^-20 ≈ 5e-4 of the time) computes the tail's exact weights and picks among them
  or, in the envelope's slack, draws again from the whole exact distribution: rejection
  sampling, so every token has exactly its softmax probability.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from edgeserve.engine._rowdraw import draw
from edgeserve.engine.types import SamplingParams

T = TypeVar("T")

PENALTY_LAST_N = 64
"""How many of the latest generated tokens the penalties count (llama.cpp's `penalty_last_n`)."""
HEAD_GAP = 20.0
"""Tokens more than this many units of logit/T below the best are drawn through the envelope."""
TEMPERATURES = (1e-30, 1e30)
"""The temperatures a draw works with (the API takes any that is not negative)."""
DRAW_BLOCK = 64
"""Logits per block of the compiled draw (rowdraw.c's BLOCK): its scratch holds a sum and the
greatest logit of each."""
UNIFORMS = 64
"""Uniforms a draw's generator makes at a time: a call of numpy's `Generator.random` costs
~20 µs on the engine thread after a decode has emptied the caches, a pop from a list ~1."""


class Penalties:
    """llama.cpp's repetition, frequency and presence penalties over the last PENALTY_LAST_N
    generated tokens (llama_sampler_init_penalties, same arithmetic)."""

    def __init__(self, params: SamplingParams) -> None:
        self.repeat = params.repeat_penalty
        self.frequency = params.frequency_penalty
        self.presence = params.presence_penalty
        self.active = self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0
        self._recent: deque[int] = deque(maxlen=PENALTY_LAST_N)
        self._counts: Counter[int] = Counter()

    def accept(self, token: int) -> None:
        """Count a generated token (the oldest of a full window drops out)."""
        if not self.active:
            return
        if len(self._recent) == PENALTY_LAST_N:
            oldest = self._recent[0]
            self._counts[oldest] -= 1
            if not self._counts[oldest]:
                del self._counts[oldest]
        self._recent.append(token)
        self._counts[token] += 1

    def counted(self) -> np.ndarray | None:
        """The ids `apply` changes (None when it changes none)."""
        if not self._counts:
            return None
        return np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))

    def apply(self, logits: np.ndarray) -> None:
        """Penalise the counted tokens of `logits` in place."""
        ids = self.counted()
        if ids is None:
            return
        counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
        values = logits[ids]
        values = np.where(values <= 0, values * self.repeat, values / self.repeat)
        values -= counts * np.float32(self.frequency) + np.float32(self.presence)
        logits[ids] = values


class RowSampler:
    """Greedy or exact seeded sampling of one sequence from raw logit rows, with its logit
    bias and penalties; `rng` is the sequence's seeded generator."""

    def __init__(self, params: SamplingParams, n_vocab: int, rng: np.random.Generator) -> None:
        bias = {t: b for t, b in params.logit_bias.items() if 0 <= t < n_vocab}
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self.penalties = Penalties(params)
        # Past TEMPERATURES float32 cannot tell a temperature from its limit: arg-max below,
        # every token alike above.
        self.greedy = params.greedy or params.temperature < TEMPERATURES[0]
        self.temperature = min(params.temperature, TEMPERATURES[1])
        self._rng = rng
        self._uniforms: list[float] = []  # the generator's next uniforms, the next one last
        # Neither logit bias nor penalties: a token is a draw from the row as it is.
        self._plain = not self._bias_ids.size and not self.penalties.active
        self._inside = np.empty(n_vocab, dtype=bool)
        self._scratch = np.empty(2 * -(-n_vocab // DRAW_BLOCK), dtype=np.float64)  # draw's

    @staticmethod
    def handles(params: SamplingParams) -> bool:
        """Whether RowSampler draws for these params: greedy, or no top-k/top-p/min-p (those
        stay in llama.cpp's chain)."""
        return params.greedy or (params.top_k <= 0 and params.top_p >= 1.0 and params.min_p <= 0.0)

    def sample(self, row: np.ndarray) -> int:
        """The next token from a raw logit row (read, never written), counted for the penalties."""
        if self._plain:  # every token of most requests: no call that would do nothing
            return int(row.argmax()) if self.greedy else self._draw(row)
        token = self.choose(row)
        self.accept(token)
        return token

    def choose(self, row: np.ndarray) -> int:
        """A token drawn from a raw logit row, not yet counted. Logit bias and penalties are
        applied to their own few ids of the row in place and undone before it returns (a
        copy of the row would be a pass over the whole vocabulary), so the row reads the same
        afterwards."""
        return self._adjusted(row, self._pick)

    def draws(self, row: np.ndarray, k: int) -> np.ndarray:
        """`k` independent draws from a raw logit row's distribution (as `choose`, none
        counted): the tries of a grammar's rejection sampling, from one pass over the row.
        Greedy: the best token `k` times."""
        return self._adjusted(row, lambda logits: self._draws(logits, k))

    def _adjusted(self, row: np.ndarray, pick: Callable[[np.ndarray], T]) -> T:
        """`pick` of the row with logit bias and penalties applied (see `choose`)."""
        penalties = self.penalties
        touched = self._touched() if penalties.active else self._bias_ids
        if touched is None or not touched.size:
            return pick(row)
        saved = row[touched]
        try:
            row[self._bias_ids] += self._bias_values
            if penalties.active:
                penalties.apply(row)
            return pick(row)
        finally:
            row[touched] = saved

    def accept(self, token: int) -> None:
        """Count a token generated after `choose` (or chosen elsewhere) for the penalties."""
        self.penalties.accept(token)

    def _touched(self) -> np.ndarray | None:
        """The ids logit bias and penalties change (None when they change none)."""
        counted = self.penalties.counted()
        if counted is None:
            return self._bias_ids if self._bias_ids.size else None
        return np.concatenate((self._bias_ids, counted)) if self._bias_ids.size else counted

    def _pick(self, logits: np.ndarray) -> int:
        return int(logits.argmax()) if self.greedy else self._draw(logits)

    def _draw(self, logits: np.ndarray) -> int:
        """A token with probability softmax(logits / T), by the head and its envelope
        (rowdraw.c)."""
        uniforms = self._uniforms
        u = uniforms.pop() if uniforms else self._uniform()
        return draw(logits, self.temperature, HEAD_GAP, u, self._uniform, self._scratch)

    def _uniform(self) -> float:
        """The generator's next uniform in [0, 1), made UNIFORMS at a time: the same
        sequence as one `random()` call each."""
        if not self._uniforms:
            self._uniforms = self._rng.random(UNIFORMS).tolist()[::-1]
        return self._uniforms.pop()

    def _draws(self, logits: np.ndarray, k: int) -> np.ndarray:
        """`k` draws from `_draw`'s distribution, in numpy: the head and its running sum are
        worked out once and every uniform searched in it; one that lands in the envelope goes
        on to the tail's exact weights, as the compiled draw does (`k` calls of it would make
        `k` passes over the row)."""
        if self.greedy:
            return np.full(k, int(logits.argmax()), dtype=np.int64)
        best = float(logits.max())
        threshold = np.float32(best - HEAD_GAP * self.temperature)
        inside = np.greater_equal(logits, threshold, out=self._inside)
        head = inside.nonzero()[0]
        weights = (logits[head] - np.float32(best)) / np.float32(self.temperature)
        cumulative = np.cumsum(np.exp(weights), dtype=np.float64)
        mass = float(cumulative[-1])
        envelope = (logits.size - head.size) * math.exp(-HEAD_GAP)
        u = self._rng.random(k) * (mass + envelope)
        drawn = head[np.minimum(cumulative.searchsorted(u, side="right"), head.size - 1)]
        if head.size < logits.size:
            for i in np.flatnonzero(u >= mass):
                drawn[i] = self._beyond_head(logits, best, inside, float(u[i]) - mass)
        return drawn

    def _beyond_head(self, logits: np.ndarray, best: float, inside: np.ndarray, v: float) -> int:
        """A draw whose uniform landed `v` into the envelope past the head (`inside`): the
        tail token whose exact weight holds it or, in the envelope's slack, a draw from the
        whole exact distribution (rejection sampling)."""
        tail = np.flatnonzero(~inside)
        cumulative = np.cumsum(self._weights(logits[tail], best))
        if v < cumulative[-1]:
            return int(tail[_find(cumulative, v)])
        cumulative = np.cumsum(self._weights(logits, best))
        return _find(cumulative, self._rng.random() * float(cumulative[-1]))

    def _weights(self, logits: np.ndarray, best: float) -> np.ndarray:
        """exp((logit - best) / T), in float64 (a new array, worked on in place)."""
        weights = logits.astype(np.float64)
        weights -= best
        weights /= self.temperature
        return np.exp(weights, out=weights)


def _find(cumulative: np.ndarray, u: float) -> int:
    """The index whose cumulative-weight interval holds `u` (zero weights are never picked)."""
    return min(int(np.searchsorted(cumulative, u, side="right")), cumulative.size - 1)
