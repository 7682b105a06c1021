"""A reusable llama_batch filled through numpy views (no per-step allocation)."""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp.llama_cpp as lc
import numpy as np


class TokenBatch:
    """Owns one `llama_batch` of fixed capacity; each token belongs to exactly one sequence."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = lc.llama_batch_init(capacity, 0, 1)
        self._tokens = np.ctypeslib.as_array(self.raw.token, shape=(capacity,))
        self._pos = np.ctypeslib.as_array(self.raw.pos, shape=(capacity,))
        self._n_seq = np.ctypeslib.as_array(self.raw.n_seq_id, shape=(capacity,))
        self._logits = np.ctypeslib.as_array(self.raw.logits, shape=(capacity,))
        self._seq_ptrs = self.raw.seq_id
        self._n_seq[:] = 1
        self.n = 0
        # (seq, first position, tokens) of each add: what a successful decode stores.
        self.runs: list[tuple[int, int, int]] = []

    @property
    def room(self) -> int:
        """How many more tokens fit."""
        return self.capacity - self.n

    def clear(self) -> None:
        """Forget every token (the memory is reused)."""
        self.n = 0
        self.runs = []

    def add(self, token: int, pos: int, seq: int, output: bool) -> int:
        """Append one token; return its index (the row to sample from when `output`)."""
        i = self.n
        self._tokens[i] = token
        self._pos[i] = pos
        self._seq_ptrs[i][0] = seq
        self._logits[i] = output
        self.n = i + 1
        self.runs.append((seq, pos, 1))
        return i

    def add_span(
        self, tokens: Sequence[int], start_pos: int, seq: int, outputs: Sequence[int] = ()
    ) -> int:
        """Append consecutive tokens of one sequence; `outputs` are offsets that need logits.

        Returns the batch index of the first token.
        """
        i, k = self.n, len(tokens)
        self._tokens[i : i + k] = tokens
        self._pos[i : i + k] = np.arange(start_pos, start_pos + k, dtype=np.int32)
        ptrs = self._seq_ptrs
        for j in range(i, i + k):
            ptrs[j][0] = seq
        self._logits[i : i + k] = 0
        for off in outputs:
            self._logits[i + off] = 1
        self.n = i + k
        self.runs.append((seq, start_pos, k))
        return i

    @property
    def outputs(self) -> int:
        """How many of the tokens added so far ask for a logit row."""
        return int(np.count_nonzero(self._logits[: self.n]))

    def decode(self, ctx: lc.llama_context_p) -> int:
        """Run `llama_decode` on the tokens added so far; return its status code."""
        self.raw.n_tokens = self.n
        return lc.llama_decode(ctx, self.raw)

    def free(self) -> None:
        """Release the native memory."""
        lc.llama_batch_free(self.raw)
