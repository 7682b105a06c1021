"""`Backend` (ports.py) over llama-cpp-python's low-level API.

Every native handle (model, contexts, batch, samplers) is made and freed here and in
`model.py` / `sampling.py`; a --draft-model's context is `draft_model.LlamaDraftContext`.
The sizes of what it decodes are handed in (`DecodeLimits`): it reads no scheduling values.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from importlib.metadata import version

import llama_cpp.llama_cpp as lc
import numpy as np

from edgeserve.engine.audio import AudioClip
from edgeserve.engine.chat_template import ChatTemplate, resolve_template
from edgeserve.engine.images import DecodedImage
from edgeserve.engine.llama.batch import TokenBatch
from edgeserve.engine.llama.cells import CellLedger
from edgeserve.engine.llama.draft_model import LlamaDraftContext
from edgeserve.engine.llama.model import LoadedModel
from edgeserve.engine.llama.pages import discard, logit_rows, resident, trim_heap
from edgeserve.engine.llama.projector import Projector
from edgeserve.engine.llama.sampling import Sampler, grammar_sampler
from edgeserve.engine.ports import DecodeLimits, MediaEmbeddings
from edgeserve.engine.types import (
    AdapterSet,
    ChatPrompt,
    EngineConfig,
    MediaKind,
    SamplingParams,
    TokenizerInfo,
)
from edgeserve.errors import InvalidMedia

log = logging.getLogger("edgeserve.engine")

# The token a timing step repeats (what it reads does not change what a decode costs).
CALIBRATION_TOKEN = 100


class LlamaBackend:
    """`Backend` over llama-cpp-python's low-level API: loads the GGUF and its chat template,
    and the dedicated embedding model when there is one."""

    def __init__(self, config: EngineConfig, limits: DecodeLimits) -> None:
        self.config = config
        self.model = LoadedModel(config, limits)
        self.embedder = self.model
        self.draft_context: LlamaDraftContext | None = None
        self.projector: Projector | None = None
        try:
            if config.mmproj_path:
                self.projector = Projector(
                    config.mmproj_path,
                    self.model.model,
                    n_threads=self.model.n_threads,
                    use_gpu=self.model.gpu_offload,
                )
            if config.embedding_model_path:
                self.embedder = LoadedModel(config, limits, role="embedding")
            if config.draft_model_path:
                self.draft_context = LlamaDraftContext(config, limits, self.model)
            self.model.loras.load_named(config.lora_adapters)
            source = resolve_template(
                config.chat_template, self.model.chat_template, self.model.architecture
            )
            eos = lc.llama_vocab_eos(self.model.vocab)
            self._template = ChatTemplate(
                source,
                bos_token=self.model.token_text(self.model.bos),
                eos_token=self.model.token_text(eos),
            )
        except BaseException:
            self.close_models()
            raise
        model = self.model
        vocab = model.vocab
        self.tokenizer_info = TokenizerInfo(
            tokenizer_class=model.metadata.get("tokenizer.ggml.model", ""),
            bos_token=model.token_text(model.bos) or None,
            eos_token=model.token_text(eos) or None,
            pad_token=model.token_text(lc.llama_vocab_pad(vocab)) or None,
            add_bos_token=model.add_bos,
            add_eos_token=bool(lc.llama_vocab_get_add_eos(vocab)),
            vocab_size=model.n_vocab,
            model_max_length=model.n_ctx,
            chat_template=source,
        )
        self.n_ctx = model.n_ctx
        self.n_swa = model.n_swa
        self.checkpoint_budget = model.checkpoint_budget
        self.n_vocab = model.n_vocab
        self.n_seq = config.parallel
        self.is_classifier = model.is_classifier
        self.media_kinds: frozenset[MediaKind] = (
            self.projector.kinds if self.projector else frozenset()
        )
        self.add_bos = model.add_bos
        self.bos = model.bos
        self.gpu_offload = model.gpu_offload
        self.n_gpu_layers = model.n_gpu_layers
        self.flash_attn = model.flash_attn
        self.row_multiple = model.row_multiple
        self.cache_identity = _cache_identity(config, model)
        self.batch = TokenBatch(model.n_ctx if model.is_classifier else config.n_batch)
        self._cells = CellLedger()
        # The most logit rows a generation decode has asked for since the context was made
        # (what llama.cpp's output buffer holds at least), and whether any may be resident.
        self._output_rows = 0
        self._output_pages = False
        self._compute_pages = False  # whether a decode may have touched the compute buffer

    # ---- LoRA adapters ----------------------------------------------------------------------

    def load_adapter(self, adapter_id: int, path: str) -> None:
        """Load a LoRA GGUF as `adapter_id` (see Backend.load_adapter)."""
        self.model.loras.load(adapter_id, path)

    def free_adapter(self, adapter_id: int) -> None:
        """Free an adapter's weights, after taking it out of every context."""
        self.model.loras.free(adapter_id, self.model.contexts())

    def use_adapters(self, adapters: AdapterSet) -> None:
        """The adapter set the next decodes run under (see Backend.use_adapters)."""
        self.model.adapters = adapters

    # ---- generation -------------------------------------------------------------------------

    def decode(self) -> int:
        """Decode the batch in the generation context (see Backend.decode)."""
        self.model.apply_adapters(self.model.ctx)
        rc = self.batch.decode(self.model.ctx)
        if rc == 0:
            lc.llama_synchronize(self.model.ctx)
            self._output_rows = max(self._output_rows, self.batch.outputs)
            self._output_pages = self._compute_pages = True
            for seq, pos, n in self.batch.runs:
                self._cells.stored(seq, pos, n)
        return rc

    def time_steps(self, sizes: Sequence[int]) -> list[tuple[int, float]]:
        """Time a generation step of each of `sizes` logit rows in the empty context (one
        untimed step first: the first decode pays for page faults), leaving it empty, with
        the compute buffer's pages the steps touched handed back: a MiB of logits for each
        row of the largest, which no request has asked for (see Backend.time_steps)."""
        timed: list[tuple[int, float]] = []
        memory = self.model.memory
        for i, rows in enumerate([sizes[0], *sizes]):
            rows = min(rows, self.batch.capacity)
            self.batch.clear()
            self.batch.add_span([CALIBRATION_TOKEN] * rows, 0, 0, range(rows))
            started = time.perf_counter()
            rc = self.batch.decode(self.model.ctx)
            lc.llama_synchronize(self.model.ctx)
            seconds = time.perf_counter() - started
            lc.llama_memory_seq_rm(memory, 0, -1, -1)
            if rc != 0:
                break
            self._output_rows = max(self._output_rows, rows)
            self._output_pages = True
            if i:
                timed.append((rows, seconds))
        self.batch.clear()
        self.release_compute_pages()
        return timed

    def media_room(self, non_causal: bool) -> int:
        """One batch, or one micro-batch of the context for non-causal positions (see
        Backend.media_room)."""
        return self.model.n_ubatch if non_causal else self.config.n_batch

    def decode_media(self, seq: int, start: int, rows: np.ndarray, non_causal: bool) -> int:
        """Decode a media item's embedding rows into `seq` (see Backend.decode_media)."""
        ctx = self.model.ctx
        n, width = rows.shape
        batch = lc.llama_batch_init(n, width, 1)
        try:
            np.ctypeslib.as_array(batch.embd, shape=(n * width,))[:] = rows.ravel()
            np.ctypeslib.as_array(batch.pos, shape=(n,))[:] = np.arange(start, start + n)
            np.ctypeslib.as_array(batch.n_seq_id, shape=(n,))[:] = 1
            np.ctypeslib.as_array(batch.logits, shape=(n,))[:] = 0
            for i in range(n):
                batch.seq_id[i][0] = seq
            batch.n_tokens = n
            self.model.apply_adapters(ctx)
            if non_causal:
                lc.llama_set_causal_attn(ctx, False)
            try:
                rc = lc.llama_decode(ctx, batch)
            finally:
                if non_causal:
                    lc.llama_set_causal_attn(ctx, True)
            if rc == 0:
                lc.llama_synchronize(ctx)
                self._cells.stored(seq, start, n)
                self._compute_pages = True
            return rc
        finally:
            lc.llama_batch_free(batch)

    def encode_media(
        self, media: DecodedImage | AudioClip, max_positions: int
    ) -> list[list[int] | MediaEmbeddings]:
        """Through the projector, on a prepare thread (see Backend.encode_media)."""
        if self.projector is None:
            raise InvalidMedia("this model takes text only (no --mmproj)")
        return self.projector.encode(media, max_positions)

    def new_sampler(self, params: SamplingParams, seed_offset: int, gbnf: str | None) -> Sampler:
        """A native sampler chain (and grammar) reading this context's logits."""
        return Sampler(
            params,
            self.model.vocab,
            self.model.ctx,
            self.n_vocab,
            seed_offset=seed_offset,
            gbnf=gbnf,
            step_limit_s=self.config.grammar_step_limit_s,
        )

    def logit_row(self, row: int) -> np.ndarray:
        """Output row `row` of the last generation decode (a view, no copy)."""
        return self.model.logit_row(self.model.ctx, row)

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (cached)."""
        return self.model.piece(token)

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens."""
        return self.model.is_eog(token)

    # ---- KV cache ---------------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Drop positions [p0, p1) of `seq`."""
        if not self.model.seq_rm(seq, p0, p1):
            return False
        self._cells.removed(seq, p0, p1)
        return True

    def seq_cp(self, src: int, dst: int) -> None:
        """Share every cell of `src` with `dst` (no copy in a unified cache)."""
        self.model.seq_cp(src, dst)
        self._cells.copied(src, dst)

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(first, last) stored position of `seq`; (-1, -1) when empty."""
        return self.model.seq_pos_range(seq)

    def save_window(self, seq: int, position: int) -> object | None:
        """A copy of the sliding-window cells `position` of `seq` attends to (see KvCache)."""
        return self.model.save_window(seq, position)

    def restore_window(self, seq: int, state: object) -> bool:
        """Put a `save_window` copy back into `seq` (see KvCache)."""
        return self.model.restore_window(seq, state)

    def save_sequence(self, seq: int) -> tuple[object, int] | None:
        """A copy of every cell of `seq` and its size (see KvCache)."""
        return self.model.save_sequence(seq)

    def restore_sequence(self, seq: int, state: object) -> bool:
        """Put a `save_sequence` copy into empty sequence `seq` (see KvCache)."""
        if not self.model.restore_sequence(seq, state):
            return False
        self._cells.stored(seq, 0, self.model.seq_pos_range(seq)[1] + 1)
        return True

    def cells_used(self) -> int:
        """The distinct cells the generation context holds, as this backend filled and trimmed
        them (llama.cpp has no call that counts them: see cells.py)."""
        return self._cells.used

    # ---- prompts (any thread) ---------------------------------------------------------------

    @property
    def max_piece_bytes(self) -> int:
        """The longest token's bytes: a scan of the vocabulary (~0.35 s on 262k tokens on 2
        cores), made while the engine is idle rather than at start-up; the first prompt large
        enough to need it before then reads the rest."""
        return self.model.max_piece_bytes()

    def render(self, prompt: ChatPrompt) -> str:
        """Render with the chat template (sandboxed Jinja; pure Python)."""
        return self._template.render(prompt)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """llama.cpp's tokenizer (releases the GIL while it runs)."""
        return self.model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int], *, special: bool) -> str:
        """The joined pieces (cached per token), as llama-server's /detokenize joins them."""
        piece = self.model.piece
        data = b"".join(piece(token, special=special) for token in tokens)
        return data.decode("utf-8", "replace")

    def check_grammar(self, gbnf: str) -> None:
        """Parse `gbnf` once with llama.cpp (InvalidPrompt when it refuses it)."""
        lc.llama_sampler_free(grammar_sampler(self.model.vocab, gbnf))

    # ---- scoring ----------------------------------------------------------------------------

    def score_chunk(
        self, tokens: Sequence[int], start: int, outputs: Sequence[int]
    ) -> list[np.ndarray]:
        """One chunk of a text, alone in the separate scoring context (see policy.py)."""
        ctx, memory = self.model.score_context()
        if start == 0:
            # The cells only: their old values are masked out, and zeroing the buffer would
            # touch (and keep resident) all of it for every text.
            lc.llama_memory_clear(memory, False)
        self.batch.clear()
        self.batch.add_span(tokens, start, 0, outputs)
        self.model.apply_adapters(ctx)
        rc = self.batch.decode(ctx)
        if rc != 0:
            self.model.release_score_context()
            raise RuntimeError(f"llama_decode (scoring) failed with status {rc}")
        return [self.model.logit_row(ctx, off) for off in outputs]

    def classify(self, tokens: Sequence[int]) -> float:
        """A whole text in one decode; the rank head's first output."""
        model = self.model
        if model.memory:
            lc.llama_memory_clear(model.memory, True)
            self._cells.clear()
        self.batch.clear()
        self.batch.add_span(tokens, 0, 0, range(len(tokens)))
        model.apply_adapters(model.ctx)
        rc = self.batch.decode(model.ctx)
        if rc != 0:
            raise RuntimeError(f"llama_decode (classifier) failed with status {rc}")
        return float(lc.llama_get_embeddings_seq(model.ctx, 0)[0])

    @property
    def holds_score_context(self) -> bool:
        """True while the separate scoring or embeddings context is allocated."""
        return self.model.holds_score_context or self.embedder.holds_score_context

    def release_score_context(self) -> None:
        """Free the scoring and embeddings contexts."""
        self.model.release_score_context()
        self.embedder.release_score_context()

    @property
    def holds_output_pages(self) -> bool:
        """True while logit rows of a generation decode may be resident."""
        return self._output_pages

    def release_output_pages(self) -> None:
        """Hand the generation context's logit rows back to the system while idle (CPU
        builds only: a GPU build's buffer may be pinned for transfers)."""
        span = logit_rows(self.model.ctx, self._output_rows, self.n_vocab)
        if span is not None and not self.gpu_offload:
            discard(*span)
        self._output_pages = False

    @property
    def idle_work_left(self) -> bool:
        """True while the vocabulary scan behind `max_piece_bytes` is unfinished."""
        return self.model.pieces_unscanned

    def idle_work(self) -> None:
        """One slice of the vocabulary scan (see Backend.idle_work)."""
        self.model.scan_pieces()

    @property
    def holds_compute_pages(self) -> bool:
        """True while pages of the generation context's compute buffer may be resident."""
        return self._compute_pages

    def release_compute_pages(self) -> None:
        """Hand the generation context's compute buffer back to the system while idle (CPU
        builds only, as the logit rows), and the C heap's free pages: what requests' Python
        objects and llama.cpp's allocations left free in each thread's malloc arena, which
        glibc keeps until it is trimmed."""
        if self.model.scratch is not None and not self.gpu_offload:
            self.model.scratch.discard()
        trim_heap()
        self._compute_pages = False

    def resident_output_pages(self) -> int:
        """Resident pages of the generation context's logit rows (for tests)."""
        span = logit_rows(self.model.ctx, self._output_rows, self.n_vocab)
        return 0 if span is None else resident(*span)

    # ---- life -------------------------------------------------------------------------------

    def reset(self) -> None:
        """A fresh generation context in place of a broken one."""
        self._cells.clear()
        self._output_rows = 0
        self._output_pages = self._compute_pages = False
        self.model.recreate_context()

    def close(self) -> None:
        """Free the batch, the contexts and the models."""
        self.batch.free()
        self.close_models()

    def close_models(self) -> None:
        """Free the models, their contexts and the projector."""
        if self.projector is not None:
            self.projector.close()
        if self.draft_context is not None:
            self.draft_context.close()
        if self.embedder is not self.model:
            self.embedder.close()
        self.model.close()


def _cache_identity(config: EngineConfig, model: LoadedModel) -> str:
    """What a sequence's copied KV means something under: the model and projector files as
    they are on disk, the context's size, cache type and layout, and the llama.cpp build."""
    parts = []
    for path in (config.model_path, config.mmproj_path):
        if path:
            st = os.stat(path)
            parts.append(f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}")
    parts += [
        f"n_ctx={model.n_ctx}",
        f"kv={config.kv_cache_type}",
        f"swa_full={config.swa_full}",
        f"flash_attn={model.flash_attn}",
        f"llama_cpp={version('llama_cpp_python')}",
    ]
    return "|".join(parts)
