"""Native llama.cpp sampling per sequence, built from SamplingParams.

A sequence samples with its own sampler chain. A grammar is kept out of the chain and applied
lazily, as llama.cpp's own tools do: the chain picks a token from the raw candidates, the
grammar checks only that token, and only when it is refused are all candidates filtered by the
grammar and the chain run again. Filtering every candidate costs 0.1-0.6 s per token on a
262k vocabulary, while the model's own choice usually fits the grammar.

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
import json
import math
import random
import threading
import time
from typing import Any

import llama_cpp as lc
import numpy as np
from llama_cpp.llama_grammar import json_schema_to_gbnf

from edgeserve.engine.types import GrammarSpec, SamplingParams
from edgeserve.errors import InvalidPrompt

PENALTY_LAST_N = 64
# Any JSON object. The converter's grammar, not llama-cpp-python's JSON_GBNF, whose optional
# newline-and-indent whitespace rule made sampling ~8x slower and led Gemma into endless
# indentation.
JSON_OBJECT_GBNF = json_schema_to_gbnf(json.dumps({"type": "object"}))
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def grammar_text(spec: GrammarSpec) -> str:
    """The GBNF source for a grammar spec (JSON schemas are converted by llama-cpp-python)."""
    if spec.kind == "json_object":
        return JSON_OBJECT_GBNF
    if spec.kind == "json_schema":
        try:
            return json_schema_to_gbnf(spec.text)
        except Exception as exc:  # the converter raises many kinds on unsupported schemas
            raise InvalidPrompt(f"The JSON schema cannot be turned into a grammar: {exc}") from exc
    return spec.text


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

    def allows(self, grammar: Any, token: int) -> bool:
        """Whether `grammar` accepts `token` next (checks that one token only)."""
        self._one[0].id = token
        self._one[0].logit = 1.0
        self._one[0].p = 0.0
        self._single.size = 1
        self._single.selected = -1
        lc.llama_sampler_apply(grammar, ctypes.byref(self._single))
        return not math.isinf(self._one[0].logit)


class Sampler:
    """One sequence's sampling: its native chain and, kept apart, its grammar.

    Without a grammar it samples row `row` of `ctx`'s last decode on the engine thread
    (`sample`). With one it is `detached` and samples a copied row (`sample_logits`) on
    whatever thread the engine gives it, one call at a time. `seed_offset` gives sibling
    choices of one `n>1` request distinct but reproducible streams; `gbnf` is the request's
    grammar, already checked once by `grammar_text` and `grammar_sampler`; a grammar step over
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
        self.chain = _build_chain(params, n_vocab, seed_offset)
        self.ctx = ctx
        self.detached = self.grammar is not None
        self._candidates = Candidates(n_vocab) if self.detached else None
        self._lock = threading.Lock()
        self._busy = False
        self._free_when_done = False
        self.slow = False
        self.step_limit_s = step_limit_s

    def sample(self, row: int) -> int | None:
        """The next token from output row `row` of the context's last decode (no grammar)."""
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
        grammar, candidates = self.grammar, self._candidates
        assert grammar is not None and candidates is not None
        lc.llama_sampler_apply(self.chain, candidates.fill(logits))
        token, _ = candidates.selected()
        if not candidates.allows(grammar, token):
            ready = candidates.fill(logits)
            lc.llama_sampler_apply(grammar, ready)
            lc.llama_sampler_apply(self.chain, ready)
            token, logit = candidates.selected()
            if not math.isfinite(logit):
                return None
        lc.llama_sampler_accept(grammar, token)
        lc.llama_sampler_accept(self.chain, token)
        return token

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
