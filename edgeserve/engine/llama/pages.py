"""Handing memory back to the system: pages llama.cpp keeps allocated but rewrites before it
reads them again (a context's logit rows), and the C heap's free pages."""

from __future__ import annotations

import ctypes
import mmap
import sys
from typing import Any

import llama_cpp as lc

MADV_DONTNEED = 4  # Linux: the pages read as zeros until written again


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _inner_pages(address: int, size: int) -> tuple[int, int] | None:
    """(start, end) of the pages wholly inside [address, address + size); None when there
    are none, or off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    end = (address + size) // page * page
    return (start, end) if end > start else None


def discard(address: int, size: int) -> bool:
    """Drop the resident pages wholly inside [address, address + size) (Linux only; False
    where nothing was done). The memory stays allocated; only its contents go."""
    libc, pages = _libc(), _inner_pages(address, size)
    if libc is None or pages is None:
        return False
    start, end = pages
    return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED) == 0


def resident(address: int, size: int) -> int:
    """How many pages wholly inside [address, address + size) are resident (Linux; 0
    elsewhere): what `discard` hands back."""
    libc, pages = _libc(), _inner_pages(address, size)
    if libc is None or pages is None:
        return 0
    start, end = pages
    vec = (ctypes.c_ubyte * ((end - start) // mmap.PAGESIZE))()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) != 0:
        return 0
    return sum(b & 1 for b in vec)


def logit_rows(ctx: Any, rows: int, n_vocab: int) -> tuple[int, int] | None:
    """(address, bytes) of a context's first `rows` logit rows in llama.cpp's output buffer
    (None before its first decode). llama.cpp grows that buffer to the most rows a decode
    asked for (a MiB per row on a 262k vocabulary) and zeroes it; the next decode writes the
    rows it uses before anything reads them, so while idle its pages can go (`discard`)."""
    base = ctypes.cast(lc.llama_get_logits(ctx), ctypes.c_void_p).value
    return None if not base else (base, rows * n_vocab * ctypes.sizeof(ctypes.c_float))


def trim_heap() -> None:
    """Ask glibc to return free heap pages to the system (a no-op elsewhere)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
