"""Embeddings contexts: each text's vector, from llama.cpp's pooling or from hidden states.

- `PooledEmbeddings` serves a dedicated embedding model (--embedding-model), pooled as its
  metadata says (mean, CLS, last token) by llama.cpp itself. A text is decoded whole in one
  micro-batch, since a non-causal model reads the whole text at once.
- `HiddenStateEmbeddings` serves the chat model: a vector is the mean of its final hidden
  states (after the output norm: what llama.cpp pools for embeddings). llama.cpp would also run
  the output layer for every pooled token (a 262,144-row matmul on Gemma 3, more than half of
  a token's cost); an eval callback copies the hidden states out as soon as they are computed
  and stops the graph there. Under causal attention a token's state does not depend on later
  tokens, so a long text is decoded in chunks, its running sum carried between decodes, and no
  embeddings decode holds more tokens than the scheduler hands it (`DecodeLimits`).

Both run on the engine thread, in a context of their own (not the generation context).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np
from llama_cpp._ctypes_extensions import load_shared_library

from edgeserve.engine.llama.batch import TokenBatch
from edgeserve.engine.ports import EmbedSpan

# The name llama.cpp's model graphs give the last hidden states, after the output norm.
HIDDEN_STATES_TENSOR = b"result_norm"

_ggml = load_shared_library("ggml-base", Path(lc.__file__).parent / "lib")
_ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
_ggml.ggml_get_name.restype = ctypes.c_char_p
_ggml.ggml_nelements.argtypes = [ctypes.c_void_p]
_ggml.ggml_nelements.restype = ctypes.c_int64
_ggml.ggml_backend_tensor_get.argtypes = [
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_size_t,
]
_ggml.ggml_backend_tensor_get.restype = None


def _normalised(vector: np.ndarray) -> np.ndarray:
    """`vector` scaled to unit L2 norm (float32); a zero vector stays zero."""
    vector = vector.astype(np.float64)
    norm = np.linalg.norm(vector)
    return (vector / norm if norm > 0 else vector).astype(np.float32)


class _EmbeddingsContext:
    """A llama.cpp context and a batch of `capacity` tokens, for one kind of embeddings."""

    def __init__(self, ctx: Any, capacity: int) -> None:
        self.ctx = ctx
        self.memory = lc.llama_get_memory(ctx)
        self.batch = TokenBatch(capacity)

    def _decode(self, spans: Sequence[EmbedSpan]) -> None:
        """Decode the spans side by side, every token an output; RuntimeError on failure."""
        batch = self.batch
        batch.clear()
        for span in spans:
            batch.add_span(span.tokens, span.start, span.seq, range(len(span.tokens)))
        rc = batch.decode(self.ctx)
        if rc != 0:
            raise RuntimeError(f"llama_decode (embeddings) failed with status {rc}")

    def close(self) -> None:
        """Free the context and the batch."""
        self.batch.free()
        lc.llama_free(self.ctx)


class PooledEmbeddings(_EmbeddingsContext):
    """llama.cpp's own pooled embeddings of whole texts, side by side (one sequence each)."""

    whole_texts = True

    def __init__(self, ctx: Any, capacity: int, n_embd: int) -> None:
        super().__init__(ctx, capacity)
        self.n_embd = n_embd

    def embed(self, spans: Sequence[EmbedSpan]) -> list[np.ndarray | None]:
        """The vector of each span, every one a whole text."""
        assert all(span.start == 0 and span.last for span in spans)
        lc.llama_memory_clear(self.memory, True)
        self._decode(spans)
        vectors: list[np.ndarray | None] = []
        for span in spans:
            pooled = lc.llama_get_embeddings_seq(self.ctx, span.seq)
            vectors.append(_normalised(np.ctypeslib.as_array(pooled, shape=(self.n_embd,))))
        return vectors


class HiddenStateReader:
    """An eval callback that copies a decode's final hidden states out and ends the graph
    there. Pass `callback` as the context's `cb_eval` and keep this object alive with it."""

    def __init__(self, n_embd: int) -> None:
        self.n_embd = n_embd
        self.rows: np.ndarray | None = None
        self.callback = lc.ggml_backend_sched_eval_callback(self._on_tensor)

    def _on_tensor(self, tensor: int, ask: bool, _user_data: int) -> bool:
        """llama.cpp asks (`ask`) whether a tensor is wanted, then hands each wanted one over
        once computed; returning False then stops the rest of the graph."""
        if ask:
            return _ggml.ggml_get_name(tensor) == HIDDEN_STATES_TENSOR
        rows = np.empty(_ggml.ggml_nelements(tensor), dtype=np.float32)
        _ggml.ggml_backend_tensor_get(tensor, rows.ctypes.data, 0, rows.nbytes)
        self.rows = rows.reshape(-1, self.n_embd)
        return False

    def take(self, n_tokens: int) -> np.ndarray:
        """The rows the last decode produced (one per token); RuntimeError if it produced
        none, or not one per token."""
        rows, self.rows = self.rows, None
        if rows is None or rows.shape[0] != n_tokens:
            raise RuntimeError("the model's graph gave no hidden state per token")
        return rows


class HiddenStateEmbeddings(_EmbeddingsContext):
    """Mean-pooled final hidden states of a causal model, decoded in chunks."""

    whole_texts = False

    def __init__(self, ctx: Any, reader: HiddenStateReader, capacity: int) -> None:
        super().__init__(ctx, capacity)
        self.reader = reader
        self.sums: dict[int, np.ndarray] = {}

    def embed(self, spans: Sequence[EmbedSpan]) -> list[np.ndarray | None]:
        """Decode the spans side by side; a span that ends its text gets the text's vector,
        the others None (their sums wait in `sums` for the text's next span). A sequence
        not continued here (a finished or abandoned text) is dropped first."""
        continued = {span.seq for span in spans if span.start > 0}
        for seq in [seq for seq in self.sums if seq not in continued]:
            lc.llama_memory_seq_rm(self.memory, seq, -1, -1)
            del self.sums[seq]
        self._decode(spans)
        rows = self.reader.take(self.batch.n)
        vectors: list[np.ndarray | None] = []
        at = 0
        for span in spans:
            total = rows[at : at + len(span.tokens)].sum(axis=0, dtype=np.float64)
            at += len(span.tokens)
            if span.start > 0:
                total += self.sums[span.seq]
            if span.last:
                # The mean's direction is the sum's: normalising makes them the same vector.
                vectors.append(_normalised(total))
                self.sums.pop(span.seq, None)
                lc.llama_memory_seq_rm(self.memory, span.seq, -1, -1)
            else:
                self.sums[span.seq] = total
                vectors.append(None)
        return vectors
