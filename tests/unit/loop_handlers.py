"""Request handlers on a real asyncio loop (the `loop_thread` fixture's), for tests of how
the engine thread hands them its events."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from edgeserve.engine.jobs import Sink
from edgeserve.engine.loop_wake import wake_for


@dataclass
class Handler:
    """A request's handler: it awaits its queue and records, on the loop, what it took (after
    a pause that lets the GIL go, as a socket write does)."""

    sink: Sink
    queue: asyncio.Queue[Any]
    taken: list[Any]


def on_loop(loop: asyncio.AbstractEventLoop, make: Any) -> Any:
    """`make()` run on the loop's thread (what the HTTP side does there), its result."""
    return asyncio.run_coroutine_threadsafe(_call(make), loop).result(5)


async def _call(make: Any) -> Any:
    return make()


def handlers(loop: asyncio.AbstractEventLoop, n: int) -> list[Handler]:
    """`n` handlers, each a task on the loop consuming its queue until None."""

    def make() -> list[Handler]:
        made = []
        for _ in range(n):
            queue: asyncio.Queue[Any] = asyncio.Queue()
            taken: list[Any] = []
            made.append(Handler(Sink(wake_for(loop), queue.put_nowait), queue, taken))
            loop.create_task(_consume(queue, taken))
        return made

    return on_loop(loop, make)  # type: ignore[no-any-return]


async def _consume(queue: asyncio.Queue[Any], taken: list[Any]) -> None:
    while (item := await queue.get()) is not None:
        time.sleep(0.0005)  # a write that lets the GIL go: the engine thread could look now
        taken.append(item)
