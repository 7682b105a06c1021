"""Bounds on the memory the fuzzing may take (RLIMIT_AS), so that an input that makes a decoder
allocate without limit fails with a MemoryError (in a test) or an abort (in a server or worker
process) instead of exhausting the machine: a negative `minItems` once made the schema
converter write gigabytes of grammar, and the kernel killed the test run.

Only on CPU builds of llama.cpp: GPU runtimes reserve far more address space than they use."""

from __future__ import annotations

import contextlib
import functools
import resource
from collections.abc import Callable, Iterator
from pathlib import Path

import llama_cpp as lc

STATM = Path("/proc/self/statm")


@functools.cache
def _bounded() -> bool:
    return STATM.exists() and not lc.llama_supports_gpu_offload()


def limit_address_space(limit_bytes: int) -> Callable[[], None] | None:
    """A `preexec_fn` that bounds a child process's address space to `limit_bytes` (None where
    the bound does not apply)."""
    if not _bounded():
        return None

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return limit


@contextlib.contextmanager
def bounded_memory(extra_bytes: int = 2 << 30) -> Iterator[None]:
    """Within the block, this process may map at most `extra_bytes` more than it has."""
    if not _bounded():
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = int(STATM.read_text().split()[0]) * resource.getpagesize() + extra_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
