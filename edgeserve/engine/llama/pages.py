"""Handing memory back to the system: pages llama.cpp keeps allocated but rewrites before it
reads them again (a context's logit rows and compute buffer), the KV cache's pages it zeroed
when it made a context, and the C heap's free pages; and taking it for states copied out of a
context all at once (`state_buffer`)."""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np

from edgeserve.engine.llama import native_log

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


def _mapped_chunks(ranges: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """(address, length) of each chunk glibc mmap'd for a large allocation within `ranges`:
    each begins on a page with glibc's size word (IS_MMAPPED set, a length in whole pages)."""
    page = mmap.PAGESIZE
    for start, end in ranges:
        address = start
        while address + page <= end:
            word = ctypes.c_uint64.from_address(address + 8).value
            length = word & ~7
            if not word & IS_MMAPPED or length % page or not 0 < length <= end - address:
                address += page
                continue
            yield address, length
            address += length


def _of_size(length: int, sizes: Sequence[int]) -> bool:
    """Whether a chunk of `length` bytes holds a buffer llama.cpp logged as one of `sizes`."""
    return any(abs(length - size) <= CHUNK_SLACK for size in sizes)


def release_cleared(before: list[tuple[int, int]], sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Drop the pages of the zeroed host buffers of `sizes` bytes (a new context's KV cache,
    which llama.cpp zeroes when it makes it) that were mapped since `before`
    (`anonymous_ranges`); returns the (address, bytes) dropped (Linux only).

    The buffers are glibc's mmap'd chunks: each begins on a page with glibc's size word, and
    its pages after the first read as zeros again once dropped, which is what they hold. So
    nothing changes but the memory counted: a cell's pages come back as the cell is written,
    and a long context costs what its cells in use hold, not its whole size, until it fills."""
    if _libc() is None or not sizes or not sys.platform.startswith("linux"):
        return []
    page = mmap.PAGESIZE
    released = []
    for address, length in _mapped_chunks(list(_new_parts(anonymous_ranges(), before))):
        if _of_size(length, sizes):
            words = (ctypes.c_uint64 * ((length - page) // 8)).from_address(address + page)
            if not np.ctypeslib.as_array(words).any() and discard(address + page, length - page):
                released.append((address + page, length - page))
    return released


@dataclass(frozen=True)
class ScratchBuffer:
    """A context's compute buffer in host memory: the glibc chunk that holds it (`address`,
    `length`), the thread that made the context (and decodes in it), and that thread's
    `native_log.late_reserves` when it was found.

    Every tensor of a compute buffer is written by a step before the step reads it (the
    graph's inputs are set and its nodes computed anew on each decode), so while the context
    is idle its pages can go. llama.cpp keeps the pages of the largest step it ran: the logit
    rows of a step with many sequences or drafted tokens (a MiB each on a 262k vocabulary),
    a micro-batch's activations."""

    address: int
    length: int
    thread: int
    reserves: int

    def discard(self) -> bool:
        """Drop the buffer's pages (all but the chunk's first, glibc's header); False, with
        nothing done, where llama.cpp may have reserved another compute buffer since (on the
        thread that decodes in the context) or the chunk is no longer one of `length` bytes
        (freed, or moved)."""
        if native_log.late_reserves(self.thread) != self.reserves or not _is_mapped(self.address):
            return False
        word = ctypes.c_uint64.from_address(self.address + 8).value
        if word & ~7 != self.length or not word & IS_MMAPPED:
            return False
        page = mmap.PAGESIZE
        return discard(self.address + page, self.length - page)

    def resident(self) -> int:
        """Its resident pages (for tests)."""
        return resident(self.address, self.length)


def _is_mapped(address: int) -> bool:
    """Whether the page at `address` is mapped (mincore fails with ENOMEM where it is not)."""
    libc = _libc()
    if libc is None:
        return False
    vec = (ctypes.c_ubyte * 1)()
    page = address // mmap.PAGESIZE * mmap.PAGESIZE
    return libc.mincore(ctypes.c_void_p(page), ctypes.c_size_t(mmap.PAGESIZE), vec) == 0


def find_scratch(
    before: list[tuple[int, int]], sizes: Sequence[int], kv_sizes: Sequence[int]
) -> ScratchBuffer | None:
    """The compute buffer of one of `sizes` bytes mapped since `before`, told from the KV
    buffers of `kv_sizes` (None unless exactly one chunk is it; Linux only)."""
    if _libc() is None or not sizes or not sys.platform.startswith("linux"):
        return None
    found = [
        (address, length)
        for address, length in _mapped_chunks(list(_new_parts(anonymous_ranges(), before)))
        if _of_size(length, sizes) and not _of_size(length, kv_sizes)
    ]
    if len(found) != 1:
        return None
    address, length = found[0]
    thread = threading.get_ident()
    return ScratchBuffer(address, length, thread, native_log.late_reserves(thread))


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


def state_buffer(size: int) -> Any:
    """A ctypes byte array of `size` for llama.cpp to copy a state into (a sequence's cells,
    several MiB). On Linux its pages are mapped in by one call (MAP_POPULATE) rather than
    faulted in one by one as they are first written: 2.0 instead of 3.6 ms for a 6.9 MB
    sequence, time the engine thread spends between two decodes. Elsewhere a zeroed array."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if not populate or size <= 0:
        return (ctypes.c_uint8 * max(size, 0))()
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    return (ctypes.c_uint8 * size).from_buffer(memory)


def trim_heap() -> None:
    """Ask glibc to return free heap pages to the system (a no-op elsewhere)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def new_context(
    model: Any, cparams: Any
) -> tuple[Any, list[tuple[int, int]], ScratchBuffer | None]:
    """llama.cpp's context of `cparams` on `model` (NULL when it cannot make one), the
    (address, bytes) of its KV cache in host memory, which llama.cpp zeroes and which is
    handed back at once (`release_cleared`): a long context holds the memory of its cells in
    use, not of its whole size; and its compute buffer, to hand back while idle."""
    before = anonymous_ranges()
    with native_log.host_buffers() as sizes:
        ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        return ctx, [], None
    released = release_cleared(before, sizes.kv)
    scratch = find_scratch(before, sizes.compute, sizes.kv)
    log.debug(
        "KV cache of %.1f MiB, %.1f MiB of it left to fill; compute buffer of %.1f MiB%s",
        sum(sizes.kv) / 2**20,
        sum(size for _, size in released) / 2**20,
        sum(sizes.compute) / 2**20,
        "" if scratch else " (not found)",
    )
    return ctx, released, scratch
