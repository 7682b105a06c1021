"""What a model will take in memory, estimated from its GGUF header and the settings it would
run with, before anything is loaded: the weights (the file), the KV cache at its context and
sequences, and llama.cpp's compute buffers (the logit rows of a step and the micro-batch's
activations). The fleet admits a load only when the estimate fits the budget, and shows it in
`/models` beside the figure measured once the model is loaded (`resident_bytes` before and
after), within a budget that defaults to a share of the memory available
(`config.values.default_models_budget`)."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

from edgeserve.catalogue.gguf_header import read_metadata
from edgeserve.engine.types import EngineConfig

# Bytes per KV element of each cache type (q8_0: 34 bytes per 32; q4_0: 18 per 32).
KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
MICRO_BATCH = 512  # llama.cpp's micro-batch rows (edgeserve's MAX_UBATCH)
DRAFT_ROWS = 32  # logit rows a step may hold for drafts and next tokens (speculation.STEP_ROWS)
# The engine's own memory beside llama.cpp's buffers: its thread, batch and sampler arrays,
# the log-softmax and the prefix index.
ENGINE_BYTES = 24 * 2**20


@dataclass(frozen=True)
class Footprint:
    """Estimated bytes of one model: weights (every file it maps), KV cache, the rest, and
    the most its prompt cache may keep in host memory (--prompt-cache-ram)."""

    weights: int
    kv: int
    compute: int
    prompt_cache: int = 0

    @property
    def total(self) -> int:
        """All of it."""
        return self.weights + self.kv + self.compute + self.prompt_cache


def estimate(config: EngineConfig) -> Footprint:
    """The footprint of a model loaded with `config` (its files, context, sequences, cache
    type); raises OSError or gguf_header.GgufError when the model file cannot be read."""
    meta = read_metadata(config.model_path)
    weights = os.path.getsize(config.model_path)
    kv = _kv_bytes(meta, config.n_ctx, config.kv_cache_type)
    compute = _compute_bytes(meta, config.parallel) + ENGINE_BYTES
    for extra in (config.mmproj_path, config.embedding_model_path):
        if extra:
            weights += os.path.getsize(extra)
    if config.draft_model_path:
        weights += os.path.getsize(config.draft_model_path)
        draft = read_metadata(config.draft_model_path)
        kv += _kv_bytes(draft, config.n_ctx, config.kv_cache_type)
        compute += _compute_bytes(draft, config.parallel)
    return Footprint(weights=weights, kv=kv, compute=compute, prompt_cache=config.prompt_cache_ram)


def _arch_value(meta: dict[str, Any], key: str, default: int = 0) -> int:
    value = meta.get(f"{meta.get('general.architecture', '')}.{key}", default)
    return int(value) if isinstance(value, int | float) else default


def _kv_bytes(meta: dict[str, Any], n_ctx: int, kv_type: str) -> int:
    """Every layer's K and V rows for `n_ctx` cells (sliding-window layers counted whole: an
    upper bound, as --swa-full makes them)."""
    n_ctx = n_ctx or _arch_value(meta, "context_length", 4096)
    layers = _arch_value(meta, "block_count")
    n_embd = _arch_value(meta, "embedding_length")
    heads = max(1, _arch_value(meta, "attention.head_count", 1))
    kv_heads = _arch_value(meta, "attention.head_count_kv", heads) or heads
    key = _arch_value(meta, "attention.key_length", n_embd // heads)
    value = _arch_value(meta, "attention.value_length", n_embd // heads)
    return int(layers * n_ctx * kv_heads * (key + value) * KV_BYTES.get(kv_type, 2.0))


def _compute_bytes(meta: dict[str, Any], parallel: int) -> int:
    """The logit rows of a step (each sequence's and its drafts') and a micro-batch's float
    activations (its widest layers, a few at a time)."""
    vocab = _arch_value(meta, "vocab_size") or int(meta.get("tokenizer.ggml.tokens", 0))
    n_embd = _arch_value(meta, "embedding_length")
    n_ff = _arch_value(meta, "feed_forward_length", 4 * n_embd)
    logits = 4 * vocab * (parallel + DRAFT_ROWS)
    activations = 4 * MICRO_BATCH * (4 * n_embd + 2 * n_ff)
    return logits + activations


def resident_bytes() -> int:
    """This process's resident memory (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * mmap.PAGESIZE
