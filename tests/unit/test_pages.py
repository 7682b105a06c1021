"""pages.release_cleared: the pages of a zeroed host buffer (a new context's KV cache) are
handed back and it still reads zeros; nothing else is touched. pages.find_scratch and
ScratchBuffer: a new context's compute buffer is told from its KV caches, and its pages go
while idle unless it may have moved. pages.state_buffer: mapped in whole before it is
written. Real glibc buffers, real madvise and mincore (Linux
only)."""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import sys
import threading
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from edgeserve.engine.llama import native_log, pages

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="madvise, mincore and /proc/self/maps are Linux's"
)

PAGE = mmap.PAGESIZE
SIZE = 40 * 2**20  # above glibc's largest mmap threshold (32 MiB): a chunk of its own
LIBC = ctypes.CDLL(None)


def in_a_fresh_process(check: Callable[[list[int]], None]) -> None:
    """Run `check` with a list that collects its buffers (freed after it) in a new
    interpreter: there glibc maps a 40 MiB buffer on its own, as it does a new context's KV
    cache, while a long test session's grown heap may hold a free chunk that large."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_with_buffers, (check,))


def _with_buffers(check: Callable[[list[int]], None]) -> None:
    made: list[int] = []
    try:
        check(made)
    finally:
        for address in made:
            LIBC.free(ctypes.c_void_p(address))


def allocate(made: list[int], size: int, fill: int) -> int:
    """A buffer as ggml allocates a KV cache (posix_memalign, 64), every byte set to `fill`."""
    pointer = ctypes.c_void_p()
    assert (
        LIBC.posix_memalign(ctypes.byref(pointer), ctypes.c_size_t(64), ctypes.c_size_t(size)) == 0
    )
    assert pointer.value is not None
    made.append(pointer.value)
    ctypes.memset(pointer.value, fill, size)
    return pointer.value


def contents(address: int, size: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_ubyte * size).from_address(address))


def test_a_zeroed_buffer_s_pages_go_and_come_back_as_it_is_written():
    in_a_fresh_process(_zeroed_buffer_goes_and_comes_back)


def _zeroed_buffer_goes_and_comes_back(buffers: list[int]) -> None:
    before = pages.anonymous_ranges()
    address = allocate(buffers, SIZE, 0)
    assert pages.resident(address, SIZE) >= SIZE // PAGE - 1
    released = pages.release_cleared(before, [SIZE])
    assert len(released) == 1
    start, length = released[0]
    assert start <= address + PAGE and start + length >= address + SIZE, "all but its first page"
    assert pages.resident(address, SIZE) <= 1
    ctypes.memset(address + SIZE // 2, 7, 3 * PAGE)
    assert pages.resident(address, SIZE) in (3, 4), "a written page comes back"
    # (Reading a dropped page maps the kernel's shared zero page, which mincore counts.)
    assert contents(address + SIZE // 2, 3 * PAGE).min() == 7
    assert not contents(address, SIZE // 2).any(), "the rest reads zeros"


def test_only_zeroed_new_buffers_of_the_logged_sizes_go():
    in_a_fresh_process(_only_zeroed_new_buffers_go)


def _only_zeroed_new_buffers_go(buffers: list[int]) -> None:
    older = allocate(buffers, SIZE, 0)
    before = pages.anonymous_ranges()
    written = allocate(buffers, SIZE, 0)
    ctypes.memset(written + SIZE - 100, 1, 1)  # one byte that is not zero
    other_size = allocate(buffers, SIZE + 2**20, 0)
    assert pages.release_cleared(before, [SIZE]) == []
    for address, size in ((older, SIZE), (written, SIZE), (other_size, SIZE + 2**20)):
        assert pages.resident(address, size) >= size // PAGE - 1
    assert contents(written + SIZE - 100, 1)[0] == 1
    assert pages.release_cleared(before, []) == []


def test_new_parts_are_what_no_earlier_range_covers():
    before = [(100, 200), (300, 400)]
    assert list(pages._new_parts([(0, 500)], before)) == [(0, 100), (200, 300), (400, 500)]
    assert list(pages._new_parts([(150, 350)], before)) == [(200, 300)]
    assert list(pages._new_parts([(100, 200)], before)) == []
    assert list(pages._new_parts([(500, 600)], before)) == [(500, 600)]


def test_a_compute_buffer_is_found_among_new_buffers_and_its_pages_go_while_idle():
    in_a_fresh_process(_compute_buffer_found_and_dropped)


def _compute_buffer_found_and_dropped(buffers: list[int]) -> None:
    kv_size = SIZE + 4 * 2**20
    allocate(buffers, SIZE, 1)  # before the context: not its compute buffer
    before = pages.anonymous_ranges()
    kv = allocate(buffers, kv_size, 0)
    address = allocate(buffers, SIZE, 1)  # the steps wrote it
    scratch = pages.find_scratch(before, [SIZE], [kv_size])
    assert scratch is not None
    assert scratch.address < address < scratch.address + mmap.PAGESIZE
    assert scratch.resident() >= SIZE // PAGE - 1
    other = threading.Thread(target=native_log._on_compute_buffer, args=(SIZE,))
    other.start()  # another engine thread's reserve, in a context of its own
    other.join()
    assert scratch.discard()
    assert scratch.resident() <= 1, "all but glibc's header page"
    assert pages.resident(kv, kv_size) >= kv_size // PAGE - 1, "the KV cache stays"
    ctypes.memset(address, 5, 3 * PAGE)  # the next step writes before it reads
    assert contents(address, 3 * PAGE).min() == 5
    assert pages.find_scratch(before, [kv_size], [kv_size]) is None, "a KV cache's size"


def test_a_compute_buffer_that_may_have_moved_is_left_alone():
    in_a_fresh_process(_moved_compute_buffer_left_alone)


def _moved_compute_buffer_left_alone(buffers: list[int]) -> None:
    before = pages.anonymous_ranges()
    address = allocate(buffers, SIZE, 1)
    scratch = pages.find_scratch(before, [SIZE], [])
    assert scratch is not None
    native_log._on_compute_buffer(SIZE)  # llama.cpp reserved one on a decode
    assert not scratch.discard()
    assert pages.resident(address, SIZE) >= SIZE // PAGE - 1
    reserves = native_log.late_reserves(scratch.thread)
    moved = replace(scratch, length=scratch.length + PAGE, reserves=reserves)
    assert not moved.discard(), "another chunk at its address"
    assert pages.resident(address, SIZE) >= SIZE // PAGE - 1
    LIBC.free(ctypes.c_void_p(buffers.pop()))
    assert not replace(scratch, reserves=reserves).discard(), "unmapped"


@pytest.mark.parametrize("size", [1, PAGE, 300 * PAGE + 17])
def test_a_state_buffer_is_mapped_in_whole_before_llama_cpp_writes_it(size):
    """A state buffer's pages are all resident as it is made (one call maps them, instead of
    a fault for each page as llama.cpp writes its state), it reads zeros, and it takes
    exactly `size` bytes, through ctypes and through the buffer protocol alike."""
    buffer = pages.state_buffer(size)
    address = ctypes.addressof(buffer)
    assert address % PAGE == 0
    assert pages.resident(address, size) == size // PAGE
    assert ctypes.sizeof(buffer) == memoryview(buffer).nbytes == size
    assert bytes(buffer) == bytes(size)
    buffer[size - 1] = 255
    assert bytes(buffer)[-1] == 255
