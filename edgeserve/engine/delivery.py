"""Results leave the engine thread: one `call_soon_threadsafe` per event loop per step, on the
loop's LoopWake (loop_wake.py), whose wake-up keeps the GIL."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from edgeserve.engine.jobs import AnyJob

log = logging.getLogger("edgeserve.engine")


class Outbox:
    """Events collected during a step, delivered to their requests' loops at its end."""

    def __init__(self) -> None:
        self._items: dict[Any, list[tuple[Callable[[Any], None], Any]]] = {}

    def emit(self, job: AnyJob, event: object) -> None:
        """Queue `event` for `job`'s sink."""
        self._items.setdefault(job.sink.loop, []).append((job.sink.put, event))

    def flush(self) -> None:
        """Hand each loop its events (dropped, with a debug line, for a closed loop)."""
        items, self._items = self._items, {}
        for loop, events in items.items():
            try:
                loop.call_soon_threadsafe(_deliver, events)
            except RuntimeError:
                log.debug("dropping %d events for a closed event loop", len(events))


def _deliver(items: list[tuple[Callable[[Any], None], Any]]) -> None:
    for put, event in items:
        put(event)
