"""The engine thread's hand-off of a step's events (edgeserve/engine/delivery.py), on a real
asyncio loop in its own thread: an acknowledged flush is released only after the handlers the
events woke have run, and a loop busy elsewhere holds the engine thread no longer than the
timeout."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from edgeserve.engine.delivery import Outbox, wait_for
from edgeserve.engine.jobs import Sink
from edgeserve.engine.loop_wake import wake_for
from tests.unit.loop_handlers import handlers


@dataclass
class FakeJob:
    """What `Outbox.emit` reads of a job: its sink."""

    sink: Sink


def test_an_acknowledged_flush_returns_once_every_woken_handler_has_run(loop_thread):
    made = handlers(loop_thread, 8)
    outbox = Outbox()
    for step in range(64):
        for index, handler in enumerate(made[: 1 + step % 8]):
            outbox.emit(FakeJob(handler.sink), (step, index))
        acks = outbox.flush(acknowledged=True)
        assert len(acks) == 1  # one loop
        assert wait_for(acks, 5.0)
        for index, handler in enumerate(made[: 1 + step % 8]):
            assert handler.taken[-1] == (step, index)
    for handler in made:
        outbox.emit(FakeJob(handler.sink), None)
    assert outbox.flush() == []


def test_a_busy_loop_holds_the_engine_no_longer_than_the_timeout(loop_thread):
    (handler,) = handlers(loop_thread, 1)
    busy, free = threading.Event(), threading.Event()

    def hog() -> None:
        busy.set()
        free.wait(10)

    loop_thread.call_soon_threadsafe(hog)
    assert busy.wait(5)
    outbox = Outbox()
    outbox.emit(FakeJob(handler.sink), "token")
    acks = outbox.flush(acknowledged=True)
    assert not wait_for(acks, 0.05)  # the loop is held until the test frees it
    assert handler.taken == []
    free.set()
    assert wait_for(acks, 5.0)
    assert handler.taken == ["token"]


def test_a_closed_loop_gets_no_events_and_no_wait():
    closed = asyncio.new_event_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    sink = Sink(wake_for(closed), queue.put_nowait)
    closed.close()
    outbox = Outbox()
    outbox.emit(FakeJob(sink), "token")
    assert outbox.flush(acknowledged=True) == []
