"""How the engine thread hands a step's events to an event loop without giving up the GIL.

`loop.call_soon_threadsafe` wakes the loop by a `send` on its self-pipe, and `send` releases
the GIL: the loop thread, woken by it, takes the GIL there and renders and writes its tokens
while the engine thread waits to go on (over HTTP, 0.2-0.3 ms of every step of a stream). A
`LoopWake` wakes the loop through an eventfd of its own (a pipe where there is none), written
by a call that keeps the GIL, so the engine thread goes on with its step: on a GPU to its next
`llama_decode`, the loop working beside it for free; on the CPU to its wait for the loop
(delivery.py), which lets the GIL go only then.

Where no such call exists (no C library to load, a loop without `add_reader`, as Windows'
proactor loop), the loop's own `call_soon_threadsafe` is used.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("edgeserve.engine")


def _write_holding_gil() -> Callable[[int, bytes, int], int] | None:
    """libc's write(2) called without releasing the GIL (ctypes.PyDLL), or None."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        write = libc.write
    except (OSError, AttributeError):
        return None
    write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    write.restype = ctypes.c_ssize_t
    return write  # type: ignore[no-any-return]


def _wake_fds() -> tuple[int, int]:
    """(read end, write end) of a non-blocking wake-up: one eventfd where the OS has them (a
    wake-up is reset by one read of its counter), else a pipe (read until empty: a second
    read, and its BlockingIOError, every wake-up)."""
    if hasattr(os, "eventfd"):
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    return read_fd, write_fd


_EVENT = (1).to_bytes(8, sys.byteorder)  # what a write adds to an eventfd's counter
_WRITE = _write_holding_gil()
_WAKES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWake] = weakref.WeakKeyDictionary()
_PLAIN: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()  # no LoopWake possible


class LoopWake:
    """An event loop's wake-up for other threads: `call_soon_threadsafe` as the loop's own,
    woken through an eventfd (or pipe) of its own whose write keeps the GIL. Made on the loop's
    thread (`wake_for`); it is closed by the first call after the loop has closed, or when the
    loop is collected."""

    def __init__(self, loop: asyncio.AbstractEventLoop, write: Callable[[int, bytes, int], int]):
        self._loop = weakref.ref(loop)
        self._write = write
        self._calls: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._lock = threading.Lock()  # the write end stays open while a writer uses it
        self._read_fd, self._write_fd = _wake_fds()
        self._signal = _EVENT if self._read_fd == self._write_fd else b"\0"
        try:
            loop.add_reader(self._read_fd, self._run)
        except BaseException:
            self.close()
            raise
        weakref.finalize(loop, self.close)

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any) -> None:
        """Run `callback(*args)` on the loop soon, in the order of the calls (RuntimeError
        when the loop is closed, as the loop's own)."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            self.close()
            raise RuntimeError("Event loop is closed")
        self._calls.append((callback, args))
        with self._lock:
            if self._write_fd < 0:
                raise RuntimeError("Event loop is closed")
            if self._write(self._write_fd, self._signal, len(self._signal)) < 0:
                code = ctypes.get_errno()
                if code not in (0, errno.EAGAIN, errno.EWOULDBLOCK):  # full: a wake is due
                    raise RuntimeError(f"the event loop's wake-up failed: {os.strerror(code)}")

    def _run(self) -> None:
        """On the loop: reset the wake-up (an eventfd's one read; a pipe read until empty), then
        run every call queued so far."""
        try:
            while os.read(self._read_fd, 4096) and self._read_fd != self._write_fd:
                pass
        except BlockingIOError:
            pass
        calls = self._calls
        while calls:
            callback, args = calls.popleft()
            try:
                callback(*args)
            except Exception as exc:
                loop = self._loop()
                if loop is None:
                    raise
                loop.call_exception_handler(
                    {"message": "Exception in a call from the engine thread", "exception": exc}
                )

    def close(self) -> None:
        """Stop watching the wake-up and close it (idempotent)."""
        loop = self._loop()
        with self._lock:
            if self._read_fd < 0:
                return
            if loop is not None and not loop.is_closed():
                loop.remove_reader(self._read_fd)
            os.close(self._read_fd)
            if self._write_fd != self._read_fd:
                os.close(self._write_fd)
            self._read_fd = self._write_fd = -1


def wake_for(loop: asyncio.AbstractEventLoop) -> LoopWake | asyncio.AbstractEventLoop:
    """What the engine thread calls `call_soon_threadsafe` on to reach `loop`: its LoopWake
    (one per loop, made on first use; call on the loop's thread), or the loop itself where a
    LoopWake cannot be made."""
    wake = _WAKES.get(loop)
    if wake is not None:
        return wake
    if _WRITE is None or loop in _PLAIN:
        return loop
    try:
        wake = _WAKES[loop] = LoopWake(loop, _WRITE)
    except (NotImplementedError, OSError) as exc:
        log.debug("waking the event loop through call_soon_threadsafe: %s", exc)
        _PLAIN.add(loop)
        return loop
    return wake
