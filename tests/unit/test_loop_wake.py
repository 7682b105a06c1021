"""The engine thread's wake-up of an event loop (edgeserve/engine/loop_wake.py), on real
asyncio loops and real threads: every call runs on the loop, in order; the waking thread keeps
the GIL (so it goes on to its next decode before the loop runs); a closed loop refuses calls
and its pipe is closed; a loop without add_reader is woken its own way."""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import threading
import time
from typing import Any

import pytest

from edgeserve.engine import loop_wake
from edgeserve.engine.loop_wake import LoopWake, wake_for


async def calls_from_a_thread(wake: Any, bursts: list[int], rng: random.Random) -> list[Any]:
    """What the loop ran, in order, of `bursts` of calls made from another thread (a short
    pause after each burst)."""
    seen: list[tuple[int, int, int]] = []
    done = asyncio.Event()
    loop_thread = threading.get_ident()

    def record(item: tuple[int, int, int]) -> None:
        assert threading.get_ident() == loop_thread
        seen.append(item)
        if len(seen) == sum(bursts):
            done.set()

    def send() -> None:
        for b, n in enumerate(bursts):
            for i in range(n):
                wake.call_soon_threadsafe(record, (b, i, n))
            time.sleep(rng.random() * 0.002)

    thread = threading.Thread(target=send)
    thread.start()
    await asyncio.wait_for(done.wait(), 5)
    thread.join()
    return seen


async def test_every_call_from_other_threads_runs_on_the_loop_in_order():
    loop = asyncio.get_running_loop()
    wake = wake_for(loop)
    assert isinstance(wake, LoopWake) and wake_for(loop) is wake
    rng = random.Random(36)
    for _ in range(20):
        bursts = [rng.randint(1, 300) for _ in range(rng.randint(1, 4))]
        seen = await calls_from_a_thread(wake, bursts, rng)
        assert seen == [(b, i, n) for b, n in enumerate(bursts) for i in range(n)]


def test_the_wake_up_write_keeps_the_gil():
    """The write is a ctypes function of PyDLL's kind (ctypes' PYTHONAPI flag: called with
    the GIL held throughout), not os.write or socket.send, which release it: a loop thread
    woken by those can take the GIL before the waking thread has it back, and the engine then
    waits while the loop renders (measured over HTTP: 0.25-0.40 ms of every step)."""
    write = loop_wake._WRITE
    assert write is not None
    assert type(write)._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    assert write.restype is ctypes.c_ssize_t


def test_a_closed_loop_refuses_calls_and_its_pipe_is_closed():
    loop = asyncio.new_event_loop()
    wake = wake_for(loop)
    assert isinstance(wake, LoopWake)
    fds = (wake._read_fd, wake._write_fd)
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        wake.call_soon_threadsafe(print)
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    with pytest.raises(RuntimeError, match="closed"):
        wake.call_soon_threadsafe(print)


async def test_an_exception_in_a_call_goes_to_the_loop_s_handler_and_later_calls_run():
    loop = asyncio.get_running_loop()
    caught: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: caught.append(context))
    wake = wake_for(loop)
    later = asyncio.Event()

    def broken() -> None:
        raise ValueError("a bad call")

    def send() -> None:
        wake.call_soon_threadsafe(broken)
        wake.call_soon_threadsafe(later.set)

    threading.Thread(target=send).start()
    await asyncio.wait_for(later.wait(), 5)
    assert [type(c["exception"]) for c in caught] == [ValueError]


def test_a_loop_without_add_reader_is_woken_its_own_way(monkeypatch: pytest.MonkeyPatch):
    loop = asyncio.new_event_loop()
    try:

        def no_readers(*args: Any) -> None:
            raise NotImplementedError

        monkeypatch.setattr(loop, "add_reader", no_readers)
        assert wake_for(loop) is loop
        assert wake_for(loop) is loop
        assert loop not in loop_wake._WAKES
    finally:
        loop.close()
