"""Handing memory back to the system: pages llama.cpp keeps allocated but rewrites before it
reads them again (a context's logit rows), the KV cache's pages it zeroed when it made a
context, and the C heap's free pages."""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
from collections.abc import Sequence
from typing import Any

import llama_cpp as lc
import numpy as np

from edgeserve.engine.llama.native_log import host_kv_buffers

log = logging.getLogger("edgeserve.engine")

MADV_DONTNEED = 4  # Linux: the pages read as zeros until written again
# glibc marks a chunk it got from mmap with this bit of its size word.
IS_MMAPPED = 2
# How far a buffer's mmap'd chunk may be from the size llama.cpp logged for it (its header,
# alignment and page rounding, and the log's two decimals of MiB).
CHUNK_SLACK = 3 * 4096 + 16 * 1024


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


def anonymous_ranges() -> list[tuple[int, int]]:
    """(start, end) of this process's private anonymous read-write mappings (Linux; none
    elsewhere)."""
    if not sys.platform.startswith("linux"):
        return []
    ranges = []
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) == 5 and fields[1] == "rw-p" and fields[4] == "0":
                start, end = (int(part, 16) for part in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def _new_parts(ranges: list[tuple[int, int]], before: list[tuple[int, int]]):
    """The parts of `ranges` that no range of `before` covers."""
    for start, end in ranges:
        for old_start, old_end in sorted(before):
            if old_end <= start or old_start >= end:
                continue
            if old_start > start:
                yield start, old_start
            start = max(start, old_end)
        if start < end:
            yield start, end


def release_cleared(before: list[tuple[int, int]], sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Drop the pages of the zeroed host buffers of `sizes` bytes (a new context's KV cache,
    which llama.cpp zeroes when it makes it) that were mapped since `before`
    (`anonymous_ranges`); returns the (address, bytes) dropped (Linux only).

    The buffers are glibc's mmap'd chunks: each begins on a page with glibc's size word, and
    its pages after the first read as zeros again once dropped, which is what they hold. So
    nothing changes but the memory counted: a cell's pages come back as the cell is written,
    and a long context costs what its cells in use hold, not its whole size, until it fills."""
    libc = _libc()
    if libc is None or not sizes or not sys.platform.startswith("linux"):
        return []
    page = mmap.PAGESIZE
    released = []
    for start, end in _new_parts(anonymous_ranges(), before):
        address = start
        while address + page <= end:
            word = ctypes.c_uint64.from_address(address + 8).value
            length = word & ~7
            if not word & IS_MMAPPED or length % page or not 0 < length <= end - address:
                address += page
                continue
            if any(abs(length - size) <= CHUNK_SLACK for size in sizes):
                words = (ctypes.c_uint64 * ((length - page) // 8)).from_address(address + page)
                if not np.ctypeslib.as_array(words).any() and discard(
                    address + page, length - page
                ):
                    released.append((address + page, length - page))
            address += length
    return released


def logit_rows(ctx: Any, rows: int, n_vocab: int) -> tuple[int, int] | None:
    """(address, bytes) of a context's first `rows` logit rows in llama.cpp's output buffer
    (None before its first decode). llama.cpp grows that buffer to the most rows a decode
    asked for (a MiB per row on a 262k vocabulary) and zeroes it; the next decode writes the
    rows it uses before anything reads them, so while idle its pages can go (`discard`)."""
    base = ctypes.cast(lc.llama_get_logits(ctx), ctypes.c_void_p).value
    return None if not base else (base, rows * n_vocab * ctypes.sizeof(ctypes.c_float))


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LARGE_ALLOCATION = 128 * 1024  # glibc's default mmap threshold


def map_large_allocations() -> None:
    """Keep glibc's mmap threshold at its default (128 KiB) for good: every large buffer
    llama.cpp allocates (KV caches, compute buffers, output rows) is then a mapping of its own,
    handed back whole when it is freed. Left alone, glibc raises the threshold to the largest
    mapped buffer freed so far, so after a model unloads the next one's buffers come from the
    heap, which keeps their pages once they are freed: a server swapping two small models
    grew by ~60 MiB a load and unload (Linux; a no-op elsewhere)."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None and sys.platform.startswith("linux"):
        mallopt(M_MMAP_THRESHOLD, LARGE_ALLOCATION)


def trim_heap() -> None:
    """Ask glibc to return free heap pages to the system (a no-op elsewhere)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def new_context(model: Any, cparams: Any) -> tuple[Any, list[tuple[int, int]]]:
    """llama.cpp's context of `cparams` on `model` (NULL when it cannot make one), and the
    (address, bytes) of its KV cache in host memory, which llama.cpp zeroes and which is
    handed back at once (`release_cleared`): a long context holds the memory of its cells in
    use, not of its whole size."""
    before = anonymous_ranges()
    with host_kv_buffers() as kv_sizes:
        ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        return ctx, []
    released = release_cleared(before, kv_sizes)
    log.debug(
        "KV cache of %.1f MiB, %.1f MiB of it left to fill",
        sum(kv_sizes) / 2**20,
        sum(size for _, size in released) / 2**20,
    )
    return ctx, released
