"""Which event loop the server runs on (`--event-loop`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the event loop `choice` names ("auto", "uvloop", "asyncio"); None for
    asyncio's own. "auto" takes uvloop when it imports (the settings have checked that
    "uvloop" does)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """ "uvloop" or "asyncio": what a running loop is, for the start-up log."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
