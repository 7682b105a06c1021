"""Logit rows of a llama.cpp context as numpy views (no copy), valid until its next decode."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np

# llama_get_logits_ith with the row's address as a plain int. The binding llama_cpp exports
# returns a ctypes pointer, and reading its address (`ctypes.cast`) leaves a reference cycle
# behind: two objects a token for the garbage collector, which then runs every few steps.
_logits_ith_address = lc._lib["llama_get_logits_ith"]  # a prototype of our own, not lc's
_logits_ith_address.argtypes = [lc.llama_context_p_ctypes, ctypes.c_int32]
_logits_ith_address.restype = ctypes.c_void_p


class RowViews:
    """numpy views of logit rows by address. llama.cpp keeps a context's output rows in one
    buffer it reuses from decode to decode, so the same few addresses come back every step;
    making a view (a new ctypes array) costs ~50 µs a token, looking one up well under 1 µs.
    A view only ever stands for an address llama.cpp has just returned for a row of `n_vocab`
    floats, so it is as valid as a fresh one."""

    LIMIT = 4096  # distinct addresses kept (the buffer moves only when it grows)

    def __init__(self) -> None:
        self._views: dict[tuple[int, int], np.ndarray] = {}

    def row(self, ctx: Any, index: int, n_vocab: int) -> np.ndarray:
        """Batch output `index`'s logits in `ctx` (see `logit_row`)."""
        address = _logits_ith_address(ctx, index)
        if not address:
            raise IndexError(f"llama.cpp has no logits for batch output {index}")
        key = (address, n_vocab)
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= self.LIMIT:
                self._views.clear()
            view = np.ctypeslib.as_array((ctypes.c_float * n_vocab).from_address(address))
            self._views[key] = view
        return view


_ROW_VIEWS = RowViews()


def logit_row(ctx: Any, index: int, n_vocab: int) -> np.ndarray:
    """Batch output `index`'s logits in `ctx`, a view into llama.cpp's buffer (no copy),
    valid until that context's next decode."""
    return _ROW_VIEWS.row(ctx, index, n_vocab)
