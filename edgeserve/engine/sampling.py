"""One native llama.cpp sampler chain per sequence, built from SamplingParams."""

from __future__ import annotations

import random
from typing import Any

import llama_cpp as lc
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from edgeserve.engine.types import GrammarSpec, SamplingParams
from edgeserve.errors import InvalidPrompt

PENALTY_LAST_N = 64


def grammar_text(spec: GrammarSpec) -> str:
    """The GBNF source for a grammar spec (JSON schemas are converted by llama-cpp-python)."""
    if spec.kind == "json_object":
        return JSON_GBNF
    if spec.kind == "json_schema":
        try:
            return json_schema_to_gbnf(spec.text)
        except Exception as exc:  # the converter raises many kinds on unsupported schemas
            raise InvalidPrompt(f"The JSON schema cannot be turned into a grammar: {exc}") from exc
    return spec.text


def grammar_sampler(vocab: Any, gbnf: str) -> Any:
    """A grammar sampler for `gbnf` (rule `root`); InvalidPrompt when llama.cpp rejects it."""
    sampler = lc.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not sampler:
        raise InvalidPrompt("The grammar could not be parsed; check its GBNF syntax.")
    return sampler


def build_sampler(
    params: SamplingParams, vocab: Any, n_vocab: int, seed_offset: int = 0, gbnf: str | None = None
) -> Any:
    """Return a new sampler chain (free it with `free_sampler`).

    Seeds are taken modulo LLAMA_DEFAULT_SEED, which llama.cpp reads as "pick one at random".
    Order: grammar → logit bias → penalties → (greedy | top-k → top-p → min-p → temperature →
    dist). `seed_offset` gives sibling choices of one `n>1` request distinct but reproducible
    streams; `gbnf` is the request's grammar, already compiled once by `grammar_text`.
    """
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if gbnf is not None:
        lc.llama_sampler_chain_add(chain, grammar_sampler(vocab, gbnf))
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


def free_sampler(chain: Any) -> None:
    """Free a chain made by `build_sampler` (and every sampler it owns)."""
    lc.llama_sampler_free(chain)
