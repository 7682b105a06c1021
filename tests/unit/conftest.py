"""Shared fixtures of the unit tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from tests.unit.fake_backend import FakeSampler


@pytest.fixture(autouse=True)
def no_leaked_samplers() -> None:
    """Start every test with no live FakeSampler, so a test that leaked one (and failed its
    own `assert_clean`) does not fail the next one's."""
    FakeSampler.live = 0


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An asyncio loop running in a thread of its own (the HTTP side's), stopped afterwards
    with its tasks cancelled."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    yield loop
    asyncio.run_coroutine_threadsafe(_cancel_tasks(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


async def _cancel_tasks() -> None:
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
