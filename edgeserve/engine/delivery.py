"""Results leave the engine thread: one `call_soon_threadsafe` per event loop per step, on the
loop's LoopWake (loop_wake.py), whose wake-up keeps the GIL. A step may then wait until each
loop has run the handlers its events woke (`Outbox.flush(acknowledged=True)`, `wait_for`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from edgeserve.engine.jobs import AnyJob

log = logging.getLogger("edgeserve.engine")

Handed = list[tuple[Callable[[Any], None], Any]]


class Outbox:
    """Events collected during a step, delivered to their requests' loops at its end."""

    def __init__(self) -> None:
        self._items: dict[Any, Handed] = {}

    def emit(self, job: AnyJob, event: object) -> None:
        """Queue `event` for `job`'s sink."""
        self._items.setdefault(job.sink.loop, []).append((job.sink.put, event))

    def flush(self, acknowledged: bool = False) -> list[threading.Lock]:
        """Hand each loop its events (dropped, with a debug line, for a closed loop). With
        `acknowledged`, a held lock per loop handed events, which that loop releases once the
        handlers its events woke have had their turn (see `wait_for`)."""
        items, self._items = self._items, {}
        acks = []
        for loop, events in items.items():
            done = threading.Lock() if acknowledged else None
            if done is not None:
                done.acquire()
            try:
                loop.call_soon_threadsafe(_deliver, events, done)
            except RuntimeError:
                log.debug("dropping %d events for a closed event loop", len(events))
                continue
            if done is not None:
                acks.append(done)
        return acks


def wait_for(acks: Sequence[threading.Lock], timeout_s: float) -> bool:
    """Wait until every lock of `Outbox.flush` is released, at most `timeout_s` in all;
    False when the time ran out first (a loop busy elsewhere, or closed)."""
    end = time.monotonic() + timeout_s
    return all(done.acquire(timeout=max(0.0, end - time.monotonic())) for done in acks)


def _deliver(items: Handed, done: threading.Lock | None) -> None:
    """On the loop: put each event; then, after the callbacks the puts scheduled (the woken
    handlers' turns), release `done` (at once where no event loop runs this)."""
    for put, event in items:
        put(event)
    if done is None:
        return
    try:
        asyncio.get_running_loop().call_soon(done.release)
    except RuntimeError:  # delivered on no event loop: no handler is left to run
        done.release()
