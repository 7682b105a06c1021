"""One native llama.cpp sampler chain per sequence, built from SamplingParams."""

from __future__ import annotations

import random
from typing import Any

import llama_cpp as lc

from edgeserve.engine.types import SamplingParams

PENALTY_LAST_N = 64


def build_sampler(params: SamplingParams, n_vocab: int, seed_offset: int = 0) -> Any:
    """Return a new sampler chain (free it with `free_sampler`).

    Seeds are taken modulo LLAMA_DEFAULT_SEED, which llama.cpp reads as "pick one at random".

    Order: logit bias → penalties → (greedy | top-k → top-p → min-p → temperature → dist).
    `seed_offset` gives sibling choices of one `n>1` request distinct but reproducible streams.
    """
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


def free_sampler(chain: Any) -> None:
    """Free a chain made by `build_sampler` (and every sampler it owns)."""
    lc.llama_sampler_free(chain)
