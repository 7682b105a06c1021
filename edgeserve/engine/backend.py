"""What the engine needs from a model, as a protocol, and its llama.cpp implementation.

The scheduler (`policy.py`) and the engine thread (`worker.py`) talk to a `Backend` only, so
the whole job lifecycle runs in unit tests against a scripted fake backend in milliseconds.
`LlamaBackend` is the real one: every native handle (model, contexts, batch, samplers) is
made and freed here and in `model.py` / `sampling.py`; `LlamaDraftContext` is a --draft-model's
context (see draft_model.py).

Thread rules: `render`, `tokenize`, `detokenize`, `piece`, `check_grammar` and the read-only
attributes may be used from any thread once the backend exists (llama.cpp's tokenizer and
grammar parser only read the vocabulary); everything else belongs to the engine thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Protocol

import llama_cpp as lc
import numpy as np

from edgeserve.engine.batch import TokenBatch
from edgeserve.engine.chat_template import ChatTemplate, resolve_template
from edgeserve.engine.draft_model import DraftContext, batch_size
from edgeserve.engine.jobs import EmbedSpan, SamplerHandle
from edgeserve.engine.model import LoadedModel, ModelLoadError
from edgeserve.engine.sampling import Sampler, grammar_sampler
from edgeserve.engine.types import ChatPrompt, EngineConfig, SamplingParams, TokenizerInfo

log = logging.getLogger("edgeserve.engine")


class Batch(Protocol):
    """The tokens of the next decode; each token belongs to one sequence."""

    n: int

    @property
    def room(self) -> int:
        """How many more tokens fit."""
        ...

    def clear(self) -> None:
        """Forget every token."""
        ...

    def add(self, token: int, pos: int, seq: int, output: bool) -> int:
        """Append one token; its batch index (the output row when `output`)."""
        ...

    def add_span(
        self, tokens: Sequence[int], start_pos: int, seq: int, outputs: Sequence[int] = ()
    ) -> int:
        """Append consecutive tokens of one sequence; the batch index of the first."""
        ...


class KvCache(Protocol):
    """The generation context's KV cache, by sequence id (llama.cpp's memory API)."""

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Drop positions [p0, p1) of `seq` (-1: open end); False when it cannot."""
        ...

    def seq_cp(self, src: int, dst: int) -> None:
        """Make `dst` hold everything `src` holds."""
        ...

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(first, last) stored position of `seq`; (-1, -1) when it holds nothing."""
        ...


class Embedder(Protocol):
    """The model that /v1/embeddings reads: the served one, or a dedicated embedding model."""

    n_vocab: int
    n_embd: int

    @property
    def embed_size(self) -> int:
        """The most tokens of one text to embed."""
        ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids for `text` in this model's vocabulary (any thread)."""
        ...

    @property
    def whole_texts(self) -> bool:
        """True when a text to embed must be decoded whole, False when it may be split."""
        ...

    def embed(self, spans: Sequence[EmbedSpan]) -> list[np.ndarray | None]:
        """Decode the spans side by side in a separate embeddings context (engine thread):
        the L2-normalised vector (float32, `n_embd` long) of each text a span ends, None for
        a span that does not end its text."""
        ...


class Backend(KvCache, Protocol):
    """A loaded model with one generation context (see the module docstring)."""

    n_ctx: int
    n_vocab: int
    embedder: Embedder
    n_seq: int
    is_classifier: bool
    add_bos: bool
    bos: int
    max_piece_bytes: int
    gpu_offload: bool
    n_gpu_layers: int
    tokenizer_info: TokenizerInfo
    batch: Batch
    # The --draft-model's context, when one is loaded (its vocabulary is this model's).
    draft_context: DraftContext | None

    def decode(self) -> int:
        """Decode `batch` in the generation context: 0 done, 1 no room in the KV cache (nothing
        stored), anything else a broken context. Returns once the step is computed (on an
        accelerator too), so its duration is the step's cost (`StepCost`)."""
        ...

    def new_sampler(
        self, params: SamplingParams, seed_offset: int, gbnf: str | None
    ) -> SamplerHandle:
        """A sampler for one sequence (raises InvalidPrompt for a grammar it cannot parse)."""
        ...

    def logit_row(self, row: int) -> np.ndarray:
        """Output row `row` of the last decode, valid until the next one."""
        ...

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for."""
        ...

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens."""
        ...

    def render(self, prompt: ChatPrompt) -> str:
        """The conversation as prompt text (raises InvalidPrompt)."""
        ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids for `text`."""
        ...

    def detokenize(self, tokens: Sequence[int], *, special: bool) -> str:
        """The text of known token ids: their pieces joined (special tokens as their text when
        `special`, else empty), invalid UTF-8 replaced."""
        ...

    def check_grammar(self, gbnf: str) -> None:
        """Raise InvalidPrompt unless `gbnf` parses."""
        ...

    def score_chunk(
        self, tokens: Sequence[int], start: int, outputs: Sequence[int]
    ) -> list[np.ndarray]:
        """Decode a chunk of one text in the scoring context (start 0 clears it); the logit
        rows of the chunk offsets in `outputs`, valid until the next score decode."""
        ...

    def classify(self, tokens: Sequence[int]) -> float:
        """A classifier head's first output for a whole text."""
        ...

    @property
    def holds_score_context(self) -> bool:
        """True while a separate scoring context is allocated."""
        ...

    def release_score_context(self) -> None:
        """Free the scoring and embeddings contexts (made again on their next use)."""
        ...

    def reset(self) -> None:
        """Make a fresh generation context (after a broken decode); every sequence is empty."""
        ...

    def close(self) -> None:
        """Free everything."""
        ...


class LlamaBackend:
    """`Backend` over llama-cpp-python's low-level API: loads the GGUF and its chat template,
    and the dedicated embedding model when there is one."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model = LoadedModel(config)
        self.embedder = self.model
        self.draft_context: LlamaDraftContext | None = None
        try:
            if config.embedding_model_path:
                self.embedder = LoadedModel(config, role="embedding")
            if config.draft_model_path:
                self.draft_context = LlamaDraftContext(config, self.model)
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
        self.n_vocab = model.n_vocab
        self.n_seq = config.parallel
        self.is_classifier = model.is_classifier
        self.add_bos = model.add_bos
        self.bos = model.bos
        self.gpu_offload = model.gpu_offload
        self.n_gpu_layers = model.n_gpu_layers
        self.batch = TokenBatch(model.n_ctx if model.is_classifier else config.n_batch)

    # ---- generation -------------------------------------------------------------------------

    def decode(self) -> int:
        """Decode the batch in the generation context (see Backend.decode)."""
        rc = self.batch.decode(self.model.ctx)
        if rc == 0:
            lc.llama_synchronize(self.model.ctx)
        return rc

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
        return self.model.seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int) -> None:
        """Share every cell of `src` with `dst` (no copy in a unified cache)."""
        self.model.seq_cp(src, dst)

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(first, last) stored position of `seq`; (-1, -1) when empty."""
        return self.model.seq_pos_range(seq)

    # ---- prompts (any thread) ---------------------------------------------------------------

    @functools.cached_property
    def max_piece_bytes(self) -> int:
        """The longest token's bytes: a scan of the vocabulary (~0.8 s on 262k tokens), made
        on the first prompt large enough to need it rather than at start-up."""
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
            lc.llama_memory_clear(memory, True)
        self.batch.clear()
        self.batch.add_span(tokens, start, 0, outputs)
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
        self.batch.clear()
        self.batch.add_span(tokens, 0, 0, range(len(tokens)))
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

    # ---- life -------------------------------------------------------------------------------

    def reset(self) -> None:
        """A fresh generation context in place of a broken one."""
        self.model.recreate_context()

    def close(self) -> None:
        """Free the batch, the contexts and the models."""
        self.batch.free()
        self.close_models()

    def close_models(self) -> None:
        """Free the models and their contexts."""
        if self.draft_context is not None:
            self.draft_context.close()
        if self.embedder is not self.model:
            self.embedder.close()
        self.model.close()


# Token texts compared between a draft model and its target (spread over the vocabulary).
VOCAB_SAMPLES = 1024


class LlamaDraftContext:
    """`DraftContext` over a --draft-model: its own model and generation context (same
    n_ctx, sequences, threads and GPU offload as the target) and batch. Refused at load unless
    its vocabulary is the target's: the same size, special tokens and token texts."""

    def __init__(self, config: EngineConfig, target: LoadedModel) -> None:
        self.model = LoadedModel(config, role="draft")
        try:
            mismatch = vocab_mismatch(self.model, target)
            if mismatch:
                raise ModelLoadError(
                    f"{self.model.path} cannot draft for {target.path}: {mismatch}"
                )
        except BaseException:
            self.model.close()
            raise
        self.n_seq = config.parallel
        self.batch = TokenBatch(batch_size(config.prefill_chunk, config.parallel))
        log.info("speculative decoding drafts with %s", self.model.path)

    def decode(self) -> int:
        """Decode the batch in the draft context (see DraftContext.decode)."""
        return self.batch.decode(self.model.ctx)

    def greedy(self, row: int) -> int:
        """The arg-max token of output row `row`."""
        return int(np.argmax(self.model.logit_row(self.model.ctx, row)))

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Drop positions [p0, p1) of draft sequence `seq`."""
        return self.model.seq_rm(seq, p0, p1)

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(first, last) stored position of draft sequence `seq`; (-1, -1) when empty."""
        return self.model.seq_pos_range(seq)

    def clear(self) -> None:
        """Empty every draft sequence."""
        lc.llama_memory_clear(self.model.memory, True)

    def close(self) -> None:
        """Free the batch, the context and the model."""
        self.batch.free()
        self.model.close()


def vocab_mismatch(draft: LoadedModel, target: LoadedModel) -> str | None:
    """How `draft`'s vocabulary differs from `target`'s (None when it does not): its size,
    BOS/EOS and whether BOS is added, then the text of VOCAB_SAMPLES tokens spread over it."""
    if draft.n_vocab != target.n_vocab:
        return f"its vocabulary has {draft.n_vocab} tokens, the model's {target.n_vocab}"
    specials = (
        ("BOS", draft.bos, target.bos),
        ("EOS", lc.llama_vocab_eos(draft.vocab), lc.llama_vocab_eos(target.vocab)),
        ("add BOS", draft.add_bos, target.add_bos),
    )
    for name, mine, theirs in specials:
        if mine != theirs:
            return f"its {name} is {mine}, the model's {theirs}"
    stride = max(1, target.n_vocab // VOCAB_SAMPLES)
    for token in [*range(0, target.n_vocab, stride), target.n_vocab - 1]:
        mine, theirs = draft.piece(token, special=True), target.piece(token, special=True)
        if mine != theirs:
            return f"its token {token} is {mine!r}, the model's {theirs!r}"
    return None
