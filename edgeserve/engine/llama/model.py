"""Loading a GGUF with llama.cpp: model, vocabulary, context, tokenizer and metadata."""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any, Literal

import llama_cpp.llama_cpp as lc
import numpy as np

from edgeserve.engine.llama.embeddings import (
    HiddenStateEmbeddings,
    HiddenStateReader,
    PooledEmbeddings,
)
from edgeserve.engine.llama.logit_rows import logit_row
from edgeserve.engine.llama.lora import LoraWeights
from edgeserve.engine.llama.native_log import (
    first_complaint,
    flash_attention,
    init_backend,
    native_complaints,
    report_missing_gpu,
)
from edgeserve.engine.llama.pages import (
    ScratchBuffer,
    map_large_allocations,
    new_context,
    state_buffer,
    trim_heap,
)
from edgeserve.engine.llama.vocab import Vocabulary
from edgeserve.engine.ports import CHUNK_ALIGN, DecodeLimits, EmbedSpan
from edgeserve.engine.types import AdapterSet, EngineConfig

log = logging.getLogger("edgeserve.engine")

# Tokens per llama.cpp micro-batch: bounds the compute buffer whatever the batch size.
MAX_UBATCH = 512
# The micro-batch of a CPU generation context with window-sized sliding caches, which
# llama.cpp sizes to the windows plus one micro-batch: 768 cells instead of 1,024 for Gemma 3
# at --parallel 1, which every sliding layer's attention spans. ~4,000 prompt tokens of Gemma
# 3 270M decoded in 8,022 against 8,382 ms (~1,300: 2,352 against 2,435).
WINDOWED_UBATCH = 256
# State calls on the sliding-window caches only (llama.cpp's "partial" state of a sequence).
_WINDOW_ONLY = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
# Pooling types a dedicated embedding model's metadata may name (mean, CLS, last token), as
# metadata strings; any other (none, or nothing said) means mean pooling.
_OWN_POOLING = {
    str(lc.LLAMA_POOLING_TYPE_MEAN),
    str(lc.LLAMA_POOLING_TYPE_CLS),
    str(lc.LLAMA_POOLING_TYPE_LAST),
}
# --flash-attn as llama.cpp's flash_attn_type.
FLASH_ATTN_TYPES = {
    "auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
# What a model is loaded for: the served (chat) model, the dedicated --embedding-model, or the
# --draft-model of speculative decoding.
ModelRole = Literal["chat", "embedding", "draft"]


class ModelLoadError(RuntimeError):
    """The GGUF could not be loaded (missing, corrupt, unsupported, or out of memory)."""


class LoadedModel(Vocabulary):
    """A llama.cpp model, a context sized for continuous batching, and (made on first use) a
    one-sequence context for scoring and a context for embeddings. A classifier / reranker
    (rank pooling) gets only the scoring context, with embeddings on; its score is the head's
    first output. The dedicated --embedding-model (role "embedding") gets only the
    embeddings context, pooled as its metadata says (mean pooling when it says nothing); else
    embeddings are the mean of the last hidden states (see embeddings.py). A --draft-model
    (role "draft") gets a generation context with one logit row per sequence.

    Owned by the engine thread; only `metadata`, `n_ctx` and friends, and the vocabulary's
    methods (`Vocabulary`), are safe to use elsewhere.
    """

    def __init__(
        self, config: EngineConfig, limits: DecodeLimits, *, role: ModelRole = "chat"
    ) -> None:
        map_large_allocations()
        init_backend()
        self.config = config
        self.limits = limits
        self.role = role
        path = {
            "chat": config.model_path,
            "embedding": config.embedding_model_path,
            "draft": config.draft_model_path,
        }[role]
        assert path is not None
        self.path = path
        self._stack = ExitStack()
        mparams = _model_params(config)
        model = _load_file(path, mparams)
        self.model = model
        self._stack.callback(lc.llama_model_free, model)
        # LoRA adapters, and the set every context of this model decodes under (lora.py).
        self.loras = LoraWeights(model)
        self._stack.callback(self.loras.forget)
        self.adapters: AdapterSet = ()
        super().__init__(lc.llama_model_get_vocab(model))
        self.metadata = _read_metadata(model)
        self.n_ctx_train = lc.llama_model_n_ctx_train(model)
        self.n_layer = lc.llama_model_n_layer(model)
        self.n_head = lc.llama_model_n_head(model)
        self.n_swa = lc.llama_model_n_swa(model)
        # Window-sized sliding-window caches for generation; full-size ones for the rest.
        self.window_sized = role == "chat" and self.n_swa > 0 and not config.swa_full
        pooling = self.metadata.get(f"{self.architecture}.pooling_type")
        self.is_classifier = pooling == str(lc.LLAMA_POOLING_TYPE_RANK)
        self.n_threads = config.n_threads or 1
        self.n_embd = lc.llama_model_n_embd(model)
        self.embed_pooling = lc.LLAMA_POOLING_TYPE_MEAN
        self._score_ctx: tuple[Any, Any] | None = None
        self._embeddings: PooledEmbeddings | HiddenStateEmbeddings | None = None
        self.embedding_only = role == "embedding"
        self.ctx: Any = None
        self.memory: Any = None
        self.n_ubatch = 0  # the generation context's micro-batch (0: no such context)
        # Whether the generation context runs flash attention, as llama.cpp resolved
        # --flash-attn (None: its log did not say).
        self.flash_attn: bool | None = None
        # (address, bytes) of the generation context's KV cache in host memory (see
        # pages.new_context), for tests that check how much of it is resident.
        self.kv_pages: list[tuple[int, int]] = []
        # The generation context's compute buffer, handed back while idle (None: not found).
        self.scratch: ScratchBuffer | None = None
        self.gpu_offload = bool(lc.llama_supports_gpu_offload())
        self.n_gpu_layers = min(self.n_layer + 1, mparams.n_gpu_layers) if self.gpu_offload else 0
        self._stack.callback(self._free_contexts)
        self._open(pooling)
        report_missing_gpu(self.gpu_offload)
        log.info(
            "loaded %s: %d layers, vocab %d, n_ctx %d, %d sequences, %d threads, "
            "flash attention %s",
            path,
            self.n_layer,
            self.n_vocab,
            self.n_ctx,
            config.parallel,
            self.n_threads,
            _on_off(self.flash_attn) if self.ctx is not None else "(no generation context)",
        )

    def _open(self, pooling: str | None) -> None:
        """Check that the model fits its role, then make its context (an embedding model's
        is made on first use) and set `n_ctx`; everything is freed when that fails."""
        if self.is_classifier and self.role != "chat":
            self._stack.close()
            kind = "an embedding" if self.embedding_only else "a generative"
            raise ModelLoadError(f"{self.path} is a reranker (rank pooling), not {kind} model")
        if self.embedding_only:
            if pooling in _OWN_POOLING:
                self.embed_pooling = int(pooling)
            self.n_ctx = self.embed_size
            return
        try:
            self.ctx, self.memory = self._new_context()
        except BaseException:
            self._stack.close()
            raise
        self.n_ctx = lc.llama_n_ctx(self.ctx)
        self.n_ubatch = lc.llama_n_ubatch(self.ctx)

    def _new_context(self) -> tuple[Any, Any]:
        """(context, memory) for generation (or, for a classifier, its one scoring context)."""
        config = self.config
        if self.is_classifier:
            # Non-causal: a whole text must fit one ubatch, and the position table ends at
            # n_ctx_train.
            n_ctx = min(config.n_ctx, self.n_ctx_train)
            cparams = self._context_params(
                n_seq=1, n_batch=n_ctx, n_ubatch=n_ctx, n_outputs=n_ctx, n_ctx=n_ctx
            )
            cparams.embeddings = True
            cparams.pooling_type = lc.LLAMA_POOLING_TYPE_RANK
            _as_reference(cparams)
        elif self.role == "draft":
            # A draft decode needs at most one logit row per sequence (draft_model.py).
            cparams = self._context_params(
                n_seq=config.parallel,
                n_batch=self.limits.draft_batch,
                n_outputs=config.parallel,
            )
        else:
            # A generation step needs one logit row per sequence, and one per drafted token.
            cparams = self._context_params(
                n_seq=config.parallel,
                n_batch=config.n_batch,
                n_outputs=config.parallel + self.limits.draft_rows,
                n_ubatch=min(config.n_batch, WINDOWED_UBATCH) if self._small_ubatch else None,
            )
            cparams.swa_full = not self.window_sized
        with native_complaints() as complaints, flash_attention() as fa:
            ctx, self.kv_pages, self.scratch = new_context(self.model, cparams)
        if not ctx:
            raise ModelLoadError(self._context_failure(complaints))
        self.flash_attn = fa.on
        return ctx, lc.llama_get_memory(ctx)

    @property
    def _small_ubatch(self) -> bool:
        """Whether the generation context takes WINDOWED_UBATCH: window-sized sliding caches,
        no layer on a GPU, and no projector (whose non-causal items need a micro-batch each)."""
        return self.window_sized and self.n_gpu_layers == 0 and self.config.mmproj_path is None

    def _context_failure(self, complaints: list[str]) -> str:
        """One line on why llama.cpp made no generation context, with its own reason."""
        config = self.config
        reason = first_complaint(complaints)
        if "quantized V cache" in reason:  # flash attention resolved off (or forced off)
            return (
                f"--kv-cache-type {config.kv_cache_type} needs flash attention, which llama.cpp "
                f"does not run for {self.path} on this backend ({reason}): use --kv-cache-type "
                "f16, or a backend with flash attention"
            )
        return (
            f"llama.cpp could not create a context of {config.n_ctx} tokens "
            f"x {config.parallel} sequences ({reason}; out of memory?)"
        )

    def apply_adapters(self, ctx: Any) -> None:
        """Make `ctx` decode under `adapters` before a decode in it."""
        self.loras.apply(ctx, self.adapters)

    def contexts(self) -> list[Any]:
        """The live contexts of this model (generation, scoring, embeddings)."""
        extra = [self._score_ctx[0]] if self._score_ctx is not None else []
        if self._embeddings is not None:
            extra.append(self._embeddings.ctx)
        return [ctx for ctx in (self.ctx, *extra) if ctx is not None]

    def recreate_context(self) -> None:
        """Free the generation context and make a new, empty one (after a failed decode)."""
        self._free_contexts()
        self.ctx, self.memory = self._new_context()

    def _free_contexts(self) -> None:
        self.release_score_context()
        if self.ctx is not None:
            lc.llama_free(self.ctx)
            self.ctx = None

    def _context_params(
        self,
        *,
        n_seq: int,
        n_batch: int,
        n_outputs: int,
        n_ctx: int | None = None,
        n_ubatch: int | None = None,
    ) -> Any:
        config = self.config
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx or config.n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_ubatch or min(n_batch, MAX_UBATCH)
        cparams.n_seq_max = n_seq
        cparams.n_outputs_max = max(n_outputs, n_seq)  # llama.cpp reserves a row per sequence
        cparams.n_outputs_max_per_seq = 0
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.kv_unified = True
        # Full-size sliding-window caches keep every position (the generation context takes
        # window-sized ones unless --swa-full: see checkpoint_budget).
        cparams.swa_full = True
        cparams.no_perf = True
        cparams.flash_attn_type = FLASH_ATTN_TYPES[config.flash_attn]
        kv_type = getattr(lc, f"GGML_TYPE_{config.kv_cache_type.upper()}")  # f16, q8_0, q4_0
        cparams.type_k = kv_type
        cparams.type_v = kv_type
        return cparams

    @property
    def architecture(self) -> str:
        """`general.architecture` from the GGUF metadata ("" when absent)."""
        return self.metadata.get("general.architecture", "")

    @property
    def chat_template(self) -> str | None:
        """The GGUF's own `tokenizer.chat_template`, if it has one."""
        return self.metadata.get("tokenizer.chat_template")

    def logit_row(self, ctx: Any, index: int) -> np.ndarray:
        """Batch output `index`'s logits in `ctx` (see `logit_row`)."""
        return logit_row(ctx, index, self.n_vocab)

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Drop positions [p0, p1) of `seq` from the generation context's KV cache."""
        return bool(lc.llama_memory_seq_rm(self.memory, seq, p0, p1))

    def seq_cp(self, src: int, dst: int) -> None:
        """Share every cell of `src` with `dst` (no copy in a unified cache)."""
        lc.llama_memory_seq_cp(self.memory, src, dst, -1, -1)

    @property
    def row_multiple(self) -> int:
        """Prompt chunks whose length is a multiple of this decode fastest (1: any length).
        With flash attention on a CPU, llama.cpp's kernel (ggml-cpu ops.cpp,
        flash_attn_ext_f16) deals a chunk's rows, tokens times query heads, out in four
        slices per thread: where the heads divide the slices, a chunk a multiple of
        slices / heads tokens long has no slice straddling two heads (planning.py)."""
        slices = 4 * self.n_threads if self.n_threads > 1 else 1
        if not self.flash_attn or self.n_gpu_layers > 0 or slices % self.n_head:
            return 1
        return math.gcd(slices // self.n_head, CHUNK_ALIGN)

    @property
    def checkpoint_budget(self) -> int:
        """The cells that window-sized sliding-window caches save over full-size ones (as
        llama.cpp sizes them: the window of every sequence and one micro-batch, rounded up to
        256 cells), which checkpoints of windows may hold in all; 0 with full-size caches."""
        if not self.window_sized:
            return 0
        window = self.n_swa * self.config.parallel + self.n_ubatch
        window = -(-min(self.n_ctx, window) // 256) * 256
        return max(0, self.n_ctx - window)

    def save_window(self, seq: int, position: int) -> Any:
        """The sliding-window cells that position `position` of `seq` attends to, copied out
        of the context (a ctypes buffer), or None. llama.cpp copies only the cells the last
        stored position (`position` - 1) still attends to, n_swa at most, not those the window
        has left behind that it has not reused yet. (So no spare sequence to copy the window
        through: llama.cpp would size every sliding cache one window larger for it, and every
        sliding layer's attention spans the whole cache once it has wrapped around.)"""
        size = lc.llama_state_seq_get_size_ext(self.ctx, seq, _WINDOW_ONLY)
        state = state_buffer(size)
        written = lc.llama_state_seq_get_data_ext(self.ctx, state, size, seq, _WINDOW_ONLY)
        return state if written == size > 0 else None

    def restore_window(self, seq: int, state: Any) -> bool:
        """Make a `save_window` copy (or its bytes read back from a file) the sliding-window
        cells of `seq` again."""
        buffer = _c_bytes(state)
        size = ctypes.sizeof(buffer)
        return lc.llama_state_seq_set_data_ext(self.ctx, buffer, size, seq, _WINDOW_ONLY) == size

    def save_sequence(self, seq: int) -> tuple[Any, int] | None:
        """Every cell of `seq` (and, with sliding-window caches, the window cells it still
        has) copied out of the context: (a ctypes buffer, its size), or None."""
        size = lc.llama_state_seq_get_size(self.ctx, seq)
        if size <= 0:
            return None
        state = state_buffer(size)
        written = lc.llama_state_seq_get_data(self.ctx, state, size, seq)
        return (state, size) if written == size else None

    def restore_sequence(self, seq: int, state: Any) -> bool:
        """Put a `save_sequence` copy (or its bytes read back) into empty sequence `seq`;
        False when it does not fit or does not match this context (`seq` is then empty)."""
        buffer = _c_bytes(state)
        size = ctypes.sizeof(buffer)
        if lc.llama_state_seq_set_data(self.ctx, buffer, size, seq) == size:
            return True
        lc.llama_memory_seq_rm(self.memory, seq, -1, -1)
        return False

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(first, last) stored position of `seq`; (-1, -1) when empty."""
        return (
            int(lc.llama_memory_seq_pos_min(self.memory, seq)),
            int(lc.llama_memory_seq_pos_max(self.memory, seq)),
        )

    def score_context(self) -> tuple[Any, Any]:
        """(context, memory) for scoring: one sequence, `limits.score_rows` rows, made on first
        use (~40 ms) and kept until `release_score_context`."""
        if self._score_ctx is None:
            rows = self.limits.score_rows
            cparams = self._context_params(n_seq=1, n_batch=rows, n_outputs=rows)
            _as_reference(cparams)
            ctx, _, _ = new_context(self.model, cparams)
            if not ctx:
                raise RuntimeError("llama.cpp could not create the scoring context")
            self._score_ctx = (ctx, lc.llama_get_memory(ctx))
        return self._score_ctx

    @property
    def embed_size(self) -> int:
        """The most tokens one text may have for embeddings: the whole text is pooled in one
        micro-batch, and the position table ends at n_ctx_train."""
        return min(self.config.n_ctx, self.n_ctx_train)

    @property
    def whole_texts(self) -> bool:
        """True when an embedded text must be decoded whole (llama.cpp pools it), False when
        it may be split across decodes (the chat model's hidden states)."""
        return self.embedding_only

    def embeddings(self) -> PooledEmbeddings | HiddenStateEmbeddings:
        """The embeddings context (see embeddings.py), made on first use and kept until
        `release_score_context`: up to `limits.embed_seqs` texts per decode."""
        if self._embeddings is not None:
            return self._embeddings
        size = self.embed_size
        seqs, chunk = self.limits.embed_seqs, self.limits.embed_tokens
        if self.embedding_only:
            cparams = self._context_params(
                n_seq=seqs, n_batch=size, n_ubatch=size, n_outputs=size, n_ctx=size
            )
            cparams.embeddings = True
            cparams.pooling_type = self.embed_pooling
            _as_reference(cparams)
            self._embeddings = PooledEmbeddings(
                self._embeddings_context(cparams), size, self.n_embd
            )
            return self._embeddings
        # Room for one text cut across decodes and the next chunk.
        cparams = self._context_params(
            n_seq=seqs, n_batch=chunk, n_outputs=chunk, n_ctx=size + chunk
        )
        _as_reference(cparams)
        reader = HiddenStateReader(self.n_embd)
        cparams.cb_eval = reader.callback
        ctx = self._embeddings_context(cparams)
        self._embeddings = HiddenStateEmbeddings(ctx, reader, chunk)
        return self._embeddings

    def _embeddings_context(self, cparams: Any) -> Any:
        ctx, _, _ = new_context(self.model, cparams)
        if not ctx:
            raise RuntimeError("llama.cpp could not create the embeddings context")
        return ctx

    def embed(self, spans: Sequence[EmbedSpan]) -> list[np.ndarray | None]:
        """Decode the spans side by side in the embeddings context: the L2-normalised vector
        (float32) of each text a span ends, None for a span that does not end its text. The
        context is freed when a decode fails."""
        try:
            embeddings = self.embeddings()
            self.apply_adapters(embeddings.ctx)
            return embeddings.embed(spans)
        except RuntimeError:
            self.release_score_context()
            raise

    @property
    def holds_score_context(self) -> bool:
        """True while a separate scoring or embeddings context is allocated (a classifier's
        one context is its scoring context, and does not count)."""
        scoring = self._score_ctx is not None and not self.is_classifier
        return scoring or self._embeddings is not None

    def release_score_context(self) -> None:
        """Free the separate scoring and embeddings contexts (their KV caches and output
        buffers, ~200 MiB of logits on a 262k vocabulary) and hand the freed pages back to the
        system."""
        if not self.holds_score_context:
            return
        if self._score_ctx is not None and not self.is_classifier:
            lc.llama_free(self._score_ctx[0])
            self._score_ctx = None
        if self._embeddings is not None:
            self._embeddings.close()
            self._embeddings = None
        trim_heap()

    def close(self) -> None:
        """Free the contexts and the model, and hand the freed heap pages back."""
        self._stack.close()
        trim_heap()


def _as_reference(cparams: Any) -> None:
    """Plain attention over an f16 KV cache, whatever --flash-attn and --kv-cache-type say:
    the scoring, classifier and embeddings contexts compute what llama.cpp's own scoring and
    embeddings compute (llama-cpp-python's `Llama`, whose defaults these are, and which their
    tests compare them with), and flash attention changes logits in their last digits. A
    quantized V cache needs flash attention, hence f16."""
    cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cparams.type_k = cparams.type_v = lc.GGML_TYPE_F16


def _on_off(flag: bool | None) -> str:
    return "unknown" if flag is None else "on" if flag else "off"


def _model_params(config: EngineConfig) -> Any:
    """llama.cpp's model parameters: GPU layers (all of them for -1), mmap and mlock."""
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = config.n_gpu_layers if config.n_gpu_layers >= 0 else 0x7FFFFFFF
    mparams.use_mmap = config.use_mmap
    mparams.use_mlock = config.use_mlock
    return mparams


def _load_file(path: str, mparams: Any) -> Any:
    """llama.cpp's model from a GGUF file; ModelLoadError with llama.cpp's own first
    complaint when it cannot load it."""
    with native_complaints() as complaints:
        model = lc.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        raise ModelLoadError(f"{path} is not a loadable GGUF ({first_complaint(complaints)})")
    return model


def _read_metadata(model: Any) -> dict[str, str]:
    """All GGUF metadata key/value pairs as strings."""
    out: dict[str, str] = {}
    n = lc.llama_model_meta_count(model)
    key_buf = ctypes.create_string_buffer(256)
    for i in range(n):
        klen = lc.llama_model_meta_key_by_index(model, i, key_buf, 256)
        if klen < 0:
            continue
        key = key_buf.value.decode("utf-8", "replace")
        vlen = lc.llama_model_meta_val_str_by_index(model, i, None, 0)
        if vlen < 0:
            continue
        val_buf = ctypes.create_string_buffer(vlen + 1)
        lc.llama_model_meta_val_str_by_index(model, i, val_buf, vlen + 1)
        out[key] = val_buf.value.decode("utf-8", "replace")
    return out


def _c_bytes(state: Any) -> Any:
    """A state as llama.cpp's state calls take it: a ctypes buffer as made here, or a
    writable bytes-like object (a memoryview of a file read into a bytearray) seen as one."""
    if isinstance(state, ctypes.Array):
        return state
    return (ctypes.c_uint8 * len(state)).from_buffer(state)
