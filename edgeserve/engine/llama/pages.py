"""Handing memory back to the system: pages llama.cpp keeps allocated but rewrites before it
reads them again (a context's logit rows), and the C heap's free pages."""

from __future__ import annotations

import ctypes
import mmap
import sys

MADV_DONTNEED = 4  # Linux: the pages read as zeros until written again


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def discard(address: int, size: int) -> bool:
    """Drop the resident pages wholly inside [address, address + size) (Linux only; False
    where nothing was done). The memory stays allocated; only its contents go."""
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return False
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    end = (address + size) // page * page
    if end <= start:
        return False
    return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED) == 0


def resident(address: int, size: int) -> int:
    """How many pages wholly inside [address, address + size) are resident (Linux; 0
    elsewhere): what `discard` hands back."""
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return 0
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    end = (address + size) // page * page
    if end <= start:
        return 0
    vec = (ctypes.c_ubyte * ((end - start) // page))()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) != 0:
        return 0
    return sum(b & 1 for b in vec)


def trim_heap() -> None:
    """Ask glibc to return free heap pages to the system (a no-op elsewhere)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
