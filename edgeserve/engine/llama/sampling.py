"""Sampling per sequence, built from SamplingParams.

A sequence without top-k/top-p/min-p samples in numpy from the raw logit row (`draw.RowSampler`:
exact, and ~10x cheaper than llama.cpp's chain over a 262k vocabulary). A sequence with them
samples with its own native llama.cpp sampler chain, and so does a grammar's, where the numpy
draw is refused (below).

A grammar is kept out of the chain and applied lazily: the numpy draw (when the params allow
one) picks a token from the raw candidates and the grammar checks only that token (a few
microseconds); refused, ROW_DRAWS more draws from the same row are checked in one grammar pass
and the first that fits is taken; then the chain's own choice. When that is refused too, the
grammar checks the most likely candidates (HEADS) in one pass, and DRAWS tokens are drawn from
those it accepts and the unchecked rest together, the rest's being checked in one more pass
(`Candidates.constrained`); only when no draw fits are all candidates filtered by the grammar
and the chain run again (~150 ms on a 262k vocabulary). Each path releases only tokens the
grammar accepts, and all of them draw from the same distribution: the chain's, restricted to
what the grammar allows (greedy: the allowed token with the highest logit). Without
top-k/top-p/min-p that is exactly the model's distribution under the grammar; with them, the
truncated candidates the grammar accepts come first, as in llama.cpp's own samplers.

A sampler with a grammar is `detached`: the engine thread hands it a copy of the logit row
and it samples on a grammar thread (`sample_logits`), so a slow grammar delays only its own
answer, never the other streams' next token. Some grammars (JSON schemas with nested
alternatives that share a prefix) make llama.cpp's grammar state grow exponentially as the
answer nests deeper, and a native grammar step cannot be interrupted; a step slower than the
sampler's `step_limit_s` marks it `slow`, and the engine ends that answer before the next step
can take longer still.
"""

from __future__ import annotations

import ctypes
import math
import random
import threading
import time
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np

from edgeserve.engine.draw import PENALTY_LAST_N, RowSampler
from edgeserve.engine.llama.logit_rows import logit_row
from edgeserve.engine.types import SamplingParams
from edgeserve.errors import InvalidPrompt

HEADS = (4096, 32768)
"""How many of the most likely candidates are checked in one grammar pass after the chain's
choice is refused, then after that finds too little (a grammar pass over 4096 candidates takes
~2 ms; over all 262,144 of Gemma's, ~150 ms)."""
ROW_DRAWS = 512
"""Independent numpy draws tried, in one grammar pass, after the first draw is refused: the
first that fits is the answer (rejection sampling: exactly the restricted distribution); only
when none fits (the grammar allows little of what the model wants) does the chain run."""
DRAWS = 1024
"""Draws from the accepted head and the unchecked tail after each head pass (at most
HEADS[-1], the size of one grammar pass)."""
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def grammar_sampler(vocab: Any, gbnf: str) -> Any:
    """A grammar sampler for `gbnf` (rule `root`); InvalidPrompt when llama.cpp rejects it
    (or the text cannot even be encoded, e.g. a lone surrogate)."""
    try:
        source = gbnf.encode()
    except UnicodeEncodeError as exc:
        raise InvalidPrompt("The grammar is not valid Unicode text.") from exc
    sampler = lc.llama_sampler_init_grammar(vocab, source, b"root")
    if not sampler:
        raise InvalidPrompt("The grammar could not be parsed; check its GBNF syntax.")
    return sampler


def _build_chain(params: SamplingParams, n_vocab: int, seed_offset: int) -> Any:
    """A new native chain: logit bias → penalties → (greedy | top-k → top-p → min-p →
    temperature → dist). Seeds are taken modulo LLAMA_DEFAULT_SEED, which llama.cpp reads as
    "pick one at random"."""
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    bias = {t: b for t, b in params.logit_bias.items() if 0 <= t < n_vocab}
    if bias:
        arr = (lc.llama_logit_bias * len(bias))()
        for slot, (token, value) in zip(arr, bias.items(), strict=True):
            slot.token = token
            slot.bias = value
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
    if (
        params.repeat_penalty != 1.0
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    ):
        lc.llama_sampler_chain_add(
            chain,
            lc.llama_sampler_init_penalties(
                n_vocab,
                PENALTY_LAST_N,
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            ),
        )
    if params.greedy:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        return chain
    if params.top_k > 0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(params.min_p, 1))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(params.temperature))
    seed = params.seed if params.seed is not None else random.getrandbits(32)
    lc.llama_sampler_chain_add(
        chain, lc.llama_sampler_init_dist((seed + seed_offset) % lc.LLAMA_DEFAULT_SEED)
    )
    return chain


class Candidates:
    """A reusable candidate list (n_vocab token entries, allocated on first use) for one
    grammar sampler, which needs the candidates in hand to filter them."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._data: np.ndarray | None = None
        self._ids = np.empty(0, dtype=np.int32)
        self._array = lc.llama_token_data_array()
        self._one = (lc.llama_token_data * 1)()
        self._single = lc.llama_token_data_array(
            data=ctypes.cast(self._one, ctypes.POINTER(lc.llama_token_data)), size=1
        )
        self._head = np.empty(0, dtype=_TOKEN_DATA)
        self._head_array = lc.llama_token_data_array()

    def fill(self, logits: np.ndarray) -> Any:
        """Load a logit row; returns the llama_token_data_array pointer for samplers."""
        if self._data is None:
            self._data = np.empty(self.n_vocab, dtype=_TOKEN_DATA)
            self._ids = np.arange(self.n_vocab, dtype=np.int32)
            self._array.data = self._data.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        self._data["id"] = self._ids
        self._data["logit"] = logits
        self._data["p"] = 0.0
        self._array.size = self.n_vocab
        self._array.selected = -1
        self._array.sorted = False
        return ctypes.byref(self._array)

    def selected(self) -> tuple[int, float]:
        """(token, logit) the last chain run picked."""
        entry = self._array.data[self._array.selected]
        return entry.id, entry.logit

    def remaining(self) -> np.ndarray:
        """The candidates the last chain run left (ids, logits after bias and penalties, and
        the probabilities its final sampler computed), in the chain's order."""
        assert self._data is not None
        assert ctypes.addressof(self._array.data.contents) == self._data.ctypes.data
        return self._data[: self._array.size]

    def allows(self, grammar: Any, token: int) -> bool:
        """Whether `grammar` accepts `token` next (checks that one token only)."""
        self._one[0].id = token
        self._one[0].logit = 1.0
        self._one[0].p = 0.0
        self._single.size = 1
        self._single.selected = -1
        lc.llama_sampler_apply(grammar, ctypes.byref(self._single))
        return not math.isinf(self._one[0].logit)

    def allowed(self, grammar: Any, tokens: np.ndarray) -> np.ndarray:
        """Which of `tokens` (at most the largest of HEADS) the grammar accepts next, as a
        boolean mask: one native grammar pass over just those candidates."""
        size = tokens.size
        if self._head.size == 0:
            self._head = np.empty(HEADS[-1], dtype=_TOKEN_DATA)
            self._head_array.data = self._head.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        self._head["id"][:size] = tokens
        self._head["logit"][:size] = 1.0
        self._head_array.size = size
        self._head_array.selected = -1
        self._head_array.sorted = False
        lc.llama_sampler_apply(grammar, ctypes.byref(self._head_array))
        return np.isfinite(self._head["logit"][:size])

    def constrained(self, grammar: Any, greedy: bool, rng: np.random.Generator) -> int | None:
        """After the chain's choice was refused: a token the grammar accepts, drawn from the
        distribution the chain left restricted to what the grammar allows; None when that
        needs the full filter.

        The most likely candidates (highest logits when greedy), HEADS[0] of them and then
        more, are checked in one grammar pass each. Greedy: the best of them the grammar
        accepts is the answer (every other token has a lower logit). Sampling: DRAWS draws
        from the accepted head and the unchecked tail together, weighted by probability; the
        tail tokens drawn are checked in one more pass, and the first draw the grammar accepts
        is the answer (rejection sampling, so it has exactly the restricted distribution)."""
        left = self.remaining()
        key = left["logit"] if greedy else left["p"]
        for size in HEADS:
            if size < left.size:
                head = np.argpartition(-key, size - 1)[:size]
            else:
                head = np.arange(left.size)
            accepted = head[self.allowed(grammar, left["id"][head])]
            if greedy:
                if accepted.size:
                    return int(left["id"][accepted[np.lexsort((accepted, -key[accepted]))[0]]])
            else:
                tail = np.ones(left.size, dtype=bool)
                tail[head] = False
                token = self._draw(grammar, left, accepted, np.flatnonzero(tail), rng)
                if token is not None:
                    return token
            if size >= left.size:
                break
        return None

    def _draw(
        self,
        grammar: Any,
        left: np.ndarray,
        accepted: np.ndarray,
        tail: np.ndarray,
        rng: np.random.Generator,
    ) -> int | None:
        """Rejection sampling: DRAWS draws from candidates `accepted` (known to fit) and
        `tail` (unchecked), weighted by probability; the first draw that fits, or None."""
        pool = np.concatenate([accepted, tail])
        if pool.size == 0:
            return None
        cumulative = np.cumsum(left["p"][pool], dtype=np.float64)
        if cumulative[-1] <= 0.0:
            return None
        picks = np.searchsorted(cumulative, rng.random(DRAWS) * cumulative[-1], side="right")
        picks = np.minimum(picks, pool.size - 1)
        drawn = left["id"][pool[picks]]
        checked = np.unique(drawn[picks >= accepted.size])
        fits = (picks < accepted.size) | np.isin(drawn, checked[self.allowed(grammar, checked)])
        return int(drawn[np.argmax(fits)]) if fits.any() else None


class Sampler:
    """One sequence's sampling: a numpy `RowSampler` or its native chain and, kept apart, its
    grammar.

    Without a grammar it samples row `row` of `ctx`'s last decode on the engine thread
    (`sample`), in numpy unless top-k/top-p/min-p need the chain. With one it is `detached`
    and samples a copied row (`sample_logits`) on whatever thread the engine gives it, one call
    at a time. `seed_offset` gives sibling
    choices of one `n>1` request distinct but reproducible streams; `gbnf` is the request's
    grammar, already checked once by `Backend.check_grammar`; a grammar step over
    `step_limit_s` seconds sets `slow`. Call `free` once when the sequence ends: while a
    detached sample is still running, the native objects are freed when it returns.
    """

    def __init__(
        self,
        params: SamplingParams,
        vocab: Any,
        ctx: Any,
        n_vocab: int,
        *,
        seed_offset: int = 0,
        gbnf: str | None = None,
        step_limit_s: float = 2.0,
    ) -> None:
        self.grammar = grammar_sampler(vocab, gbnf) if gbnf is not None else None
        self._greedy = params.greedy
        seed = None if params.seed is None else (params.seed + seed_offset) % 2**32
        self._rng = np.random.default_rng(seed)
        fast = RowSampler.handles(params)
        self._row = RowSampler(params, n_vocab, self._rng) if fast else None
        needs_chain = self.grammar is not None or not fast
        self.chain = _build_chain(params, n_vocab, seed_offset) if needs_chain else None
        self.ctx = ctx
        self.n_vocab = n_vocab
        self.detached = self.grammar is not None
        self._candidates = Candidates(n_vocab) if self.detached else None
        self._lock = threading.Lock()
        self._busy = False
        self._free_when_done = False
        self.slow = False
        self.step_limit_s = step_limit_s

    def sample(self, row: int) -> int | None:
        """The next token from output row `row` of the context's last decode (no grammar)."""
        if self._row is not None:
            return self._row.sample(logit_row(self.ctx, row, self.n_vocab))
        return int(lc.llama_sampler_sample(self.chain, self.ctx, row))

    def sample_logits(self, logits: np.ndarray) -> int | None:
        """The next token from a copied logit row, accepted by the chain and the grammar; None
        when the grammar allows no token at all. Safe on any thread (one call at a time)."""
        with self._lock:
            if self._free_when_done:
                return None
            self._busy = True
        try:
            started = time.perf_counter()
            token = self._sample_with_grammar(logits)
            self.slow = time.perf_counter() - started > self.step_limit_s
            return token
        finally:
            with self._lock:
                self._busy = False
                if self._free_when_done:
                    self._free_native()

    def _sample_with_grammar(self, logits: np.ndarray) -> int | None:
        """A numpy draw when the grammar accepts it, else the chain's paths (see the module
        docstring); accepted by the grammar, the chain and the numpy sampler."""
        grammar, candidates = self.grammar, self._candidates
        assert grammar is not None and candidates is not None
        token = self._row.choose(logits) if self._row is not None else None
        if token is not None and not candidates.allows(grammar, token):
            token = self._first_allowed_draw(grammar, candidates, logits)
        if token is None:
            token = self._chain_choice(grammar, candidates, logits)
        if token is None:
            return None
        lc.llama_sampler_accept(grammar, token)
        lc.llama_sampler_accept(self.chain, token)
        if self._row is not None:
            self._row.accept(token)
        return token

    def _first_allowed_draw(
        self, grammar: Any, candidates: Candidates, logits: np.ndarray
    ) -> int | None:
        """After the numpy draw was refused: the first of ROW_DRAWS more independent draws
        that the grammar accepts (their distinct tokens checked in one grammar pass), or None
        when it accepts none of them."""
        assert self._row is not None
        drawn = self._row.draws(logits, ROW_DRAWS)
        distinct = np.unique(drawn)
        fits = np.isin(drawn, distinct[candidates.allowed(grammar, distinct)])
        return int(drawn[np.argmax(fits)]) if fits.any() else None

    def _chain_choice(self, grammar: Any, candidates: Candidates, logits: np.ndarray) -> int | None:
        """The chain's choice if the grammar accepts it, else a constrained draw, else the full
        filter; None when the grammar allows no token."""
        lc.llama_sampler_apply(self.chain, candidates.fill(logits))
        token, _ = candidates.selected()
        if candidates.allows(grammar, token):
            return token
        token = candidates.constrained(grammar, self._greedy, self._rng)
        if token is not None:
            return token
        ready = candidates.fill(logits)
        lc.llama_sampler_apply(grammar, ready)
        lc.llama_sampler_apply(self.chain, ready)
        token, logit = candidates.selected()
        return token if math.isfinite(logit) else None

    def free(self) -> None:
        """Free the chain (and every sampler it owns) and the grammar, now or, while a
        detached sample runs, as soon as it returns."""
        with self._lock:
            self._free_when_done = True
            if not self._busy:
                self._free_native()

    def _free_native(self) -> None:
        if self.chain is not None:
            lc.llama_sampler_free(self.chain)
            self.chain = None
        if self.grammar is not None:
            lc.llama_sampler_free(self.grammar)
            self.grammar = None
