"""What the engine needs from a model, as protocols, and the plain data that crosses them.

The scheduler (`policy.py`) and the engine thread (`worker.py`) talk to a `Backend` only, so
the whole job lifecycle runs in unit tests against a scripted fake backend in milliseconds;
the llama.cpp one is `llama/backend.py`. Nothing here imports llama.cpp.

Thread rules: `render`, `tokenize`, `detokenize`, `piece`, `check_grammar` and the read-only
attributes may be used from any thread once the backend exists (llama.cpp's tokenizer and
grammar parser only read the vocabulary); everything else belongs to the engine thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from edgeserve.engine.types import (
    AdapterSet,
    ChatPrompt,
    MediaKind,
    SamplingParams,
    TokenizerInfo,
)

if TYPE_CHECKING:
    import numpy as np

    from edgeserve.engine.audio import AudioClip
    from edgeserve.engine.images import DecodedImage


# A prompt chunk alone in its decode that the batch's room cuts ends at a multiple of this
# position (llama.cpp's CPU flash attention takes the cells in tiles of 64: planning.py).
CHUNK_ALIGN = 64


@dataclass(frozen=True)
class DecodeLimits:
    """The most the scheduler hands a backend per decode, so that it sizes its contexts and
    batches for it (the values are the scheduler's: see `policy.decode_limits`)."""

    score_rows: int  # tokens (and logit rows) of one score decode
    embed_tokens: int  # tokens of one embeddings decode of the chat model's hidden states
    embed_seqs: int  # texts of one embeddings decode
    draft_rows: int  # logit rows a generation step adds for drafted tokens
    draft_batch: int  # tokens of one decode in a --draft-model's context


@dataclass(frozen=True)
class EmbedSpan:
    """Tokens `start:start + len(tokens)` of one text, decoded as sequence `seq`; `last` when
    they end the text."""

    seq: int
    tokens: Sequence[int]
    start: int
    last: bool


@dataclass(frozen=True)
class MediaEmbeddings:
    """A media item as the projector made it: one row per position it takes (float32, the
    model's embedding width), decoded with non-causal attention when `non_causal`; `digest`
    identifies the item (its pixels or its file)."""

    rows: np.ndarray
    non_causal: bool
    digest: bytes


class SamplerHandle(Protocol):
    """One sequence's sampler, as a backend makes it (see `Backend.new_sampler`).

    A `detached` sampler (one with a grammar, which can be slow) samples a copied logit row
    with `sample_logits` on a grammar thread; the others sample a row of the last decode in
    place with `sample`, on the engine thread.
    """

    slow: bool
    step_limit_s: float
    detached: bool

    def sample(self, row: int) -> int | None:
        """The next token from output row `row` of the last decode."""
        ...

    def sample_logits(self, logits: np.ndarray) -> int | None:
        """The next token from a copied row; None when the grammar allows nothing."""
        ...

    def free(self) -> None:
        """Release native resources; called exactly once, when the choice ends."""
        ...


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
    """The generation context's KV cache, by sequence id (llama.cpp's memory API).

    With sliding-window attention (`n_swa` > 0, Gemma 3: 512) llama.cpp may give a sequence's
    cells that its window has left behind (positions up to its last + 1 - n_swa) to other
    sequences, so a sequence's first stored position can move up from 0 (`seq_pos_range`).
    """

    n_swa: int  # the attention window's size; 0 without sliding-window attention
    # Cells that checkpoints of sliding windows may hold in all (0: none are taken; see
    # checkpoints.py): the cells that window-sized caches save over full-size ones.
    checkpoint_budget: int

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Drop positions [p0, p1) of `seq` (-1: open end); False when it cannot."""
        ...

    def seq_cp(self, src: int, dst: int) -> None:
        """Make `dst` hold everything `src` holds."""
        ...

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(first, last) stored position of `seq`; (-1, -1) when it holds nothing."""
        ...

    def save_window(self, seq: int, position: int) -> object | None:
        """A copy of the sliding-window cells that the token at `position` of `seq` attends to
        (`seq` holds positions 0 … position-1); None when it cannot be made."""
        ...

    def restore_window(self, seq: int, state: object) -> bool:
        """Put a `save_window` copy back as the sliding-window cells of `seq`, which holds
        exactly the positions before the copy's; False when it cannot (the caller then clears
        `seq`)."""
        ...

    def save_sequence(self, seq: int) -> tuple[object, int] | None:
        """A copy of every cell `seq` holds (with a sliding window, the window cells it still
        has) and the copy's size in bytes; None when it cannot be made."""
        ...

    def restore_sequence(self, seq: int, state: object) -> bool:
        """Put a `save_sequence` copy (or the same bytes read back from a file) into empty
        sequence `seq`; False when it does not fit or match (`seq` is left empty)."""
        ...

    def cells_used(self) -> int:
        """The distinct cells the cache holds (a cell shared by several sequences after
        `seq_cp` counts once), as the cache itself accounts them."""
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
    media_kinds: frozenset[MediaKind]  # what --mmproj lets the model take besides text
    add_bos: bool
    bos: int
    max_piece_bytes: int
    gpu_offload: bool
    n_gpu_layers: int
    flash_attn: bool | None  # whether the generation context runs it (None: not known)
    # Prompt chunks whose length is a multiple of this decode fastest (1: any length does;
    # model.py `row_multiple`): a prompt's last tokens are decoded together to keep to it.
    row_multiple: int
    # What a copied sequence's KV is only valid under (model file, context, cache type,
    # build): the disk tier of the prompt cache keeps each identity's entries apart.
    cache_identity: str
    tokenizer_info: TokenizerInfo
    batch: Batch
    # The --draft-model's context, when one is loaded (its vocabulary is this model's).
    draft_context: DraftContext | None

    def load_adapter(self, adapter_id: int, path: str) -> None:
        """Load a LoRA adapter's weights as `adapter_id` (raises InvalidAdapter when the
        file is not a LoRA adapter of this model)."""
        ...

    def free_adapter(self, adapter_id: int) -> None:
        """Free an adapter's weights; no decode runs under it afterwards."""
        ...

    def use_adapters(self, adapters: AdapterSet) -> None:
        """The adapter set the next decodes run under, in every context of the served model
        (generation, scoring, embeddings): one step runs one set."""
        ...

    def decode(self) -> int:
        """Decode `batch` in the generation context: 0 done, 1 no room in the KV cache (nothing
        stored), anything else a broken context. Returns once the step is computed (on an
        accelerator too), so its duration is the step's cost (`StepCost`)."""
        ...

    def media_room(self, non_causal: bool) -> int:
        """The most positions one media item may take: one decode, and one micro-batch when
        its positions attend to each other (non-causal)."""
        ...

    def decode_media(self, seq: int, start: int, rows: np.ndarray, non_causal: bool) -> int:
        """Decode a media item's embedding rows into `seq` at positions `start` onwards, in one
        micro-batch; the status as for `decode`."""
        ...

    def encode_media(
        self, media: DecodedImage | AudioClip, max_positions: int
    ) -> list[list[int] | MediaEmbeddings]:
        """An image's pixels or an audio file (its header read) through the projector
        (prepare thread): the tokens around it and its embeddings, in order. Raises
        InvalidMedia, or MediaTooLarge when it takes more than `max_positions` positions
        (known before anything is encoded; a clip's length is held to them first)."""
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

    def time_steps(self, sizes: Sequence[int]) -> list[tuple[int, float]]:
        """(rows, seconds) of a generation step of each of `sizes` logit rows, decoded in the
        empty context on a quiet machine and removed ([] where steps are not a machine's)."""
        ...

    @property
    def holds_output_pages(self) -> bool:
        """True while the logit rows of a generation decode may be resident."""
        ...

    def release_output_pages(self) -> None:
        """Hand the generation context's logit rows back to the system (while idle: the next
        decode writes the rows it uses)."""
        ...

    @property
    def idle_work_left(self) -> bool:
        """True while work put off until the engine is idle remains (reading every token's
        piece for `max_piece_bytes`)."""
        ...

    def idle_work(self) -> None:
        """A few milliseconds of that work (engine thread, while idle)."""
        ...

    @property
    def holds_compute_pages(self) -> bool:
        """True while pages of the generation context's compute buffer may be resident."""
        ...

    def release_compute_pages(self) -> None:
        """Hand the generation context's compute buffer, and the C heap's free pages, back to
        the system (while idle: the next decode writes what it uses of the buffer before
        reading it, and faults its pages in again)."""
        ...

    def reset(self) -> None:
        """Make a fresh generation context (after a broken decode); every sequence is empty."""
        ...

    def close(self) -> None:
        """Free everything."""
        ...


class DraftContext(Protocol):
    """A draft model's own context: `n_seq` sequences in a unified KV cache."""

    n_seq: int
    batch: Batch

    def decode(self) -> int:
        """Decode `batch`: 0 done, 1 no room (nothing stored), anything else broken."""
        ...

    def greedy(self, row: int) -> int:
        """The most likely token of output row `row` of the last decode."""
        ...

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Drop positions [p0, p1) of `seq` (-1: open end)."""
        ...

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(first, last) stored position of `seq`; (-1, -1) when it holds nothing."""
        ...

    def clear(self) -> None:
        """Empty every sequence."""
        ...
