"""What "the engine is idle" means, checked on the real engine rather than on a counter: no
live work, no decode step and no CPU time on its thread for a while, no context made anew
(each step checks every sequence's stored positions against the scheduler's records, and a
mismatch restarts the context), and a KV cache that holds exactly the prompt caches of its free
sequences: the backend's own count of the cells in use (kept call by call as it decodes,
copies and trims, see engine/llama/cells.py) against the distinct cells the scheduler records
for its free sequences."""

from __future__ import annotations

import asyncio
import os

QUIET_S = 0.3
# Clock ticks (10 ms each) the engine thread may use while idle over QUIET_S; a thread that
# spins uses ~30.
IDLE_TICKS = 4


def thread_cpu_ticks(native_id: int) -> int:
    """utime + stime of one thread of this process, in clock ticks."""
    with open(f"/proc/{os.getpid()}/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


async def _quiet_ticks(engine) -> int:
    """Clock ticks the engine thread uses over QUIET_S."""
    ticks = thread_cpu_ticks(engine.native_thread_id)
    await asyncio.sleep(QUIET_S)
    return thread_cpu_ticks(engine.native_thread_id) - ticks


async def assert_engine_idle(engine, timeout: float = 10.0) -> None:
    """Wait (up to `timeout`) until the engine has no busy slot, no score or embeddings job,
    no queued request and no idle work left (the vocabulary scan after a load), then assert
    it stays idle for QUIET_S and its KV cache holds only the prefix cache."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        stats = engine.stats()
        quiet = stats.busy_slots == 0 and stats.scoring_jobs == 0 and stats.queue_length == 0
        if quiet and not engine.backend.idle_work_left:
            break
        assert loop.time() < deadline, f"the engine is still busy: {stats}"
        await asyncio.sleep(0.02)
    steps = engine.steps
    used = await _quiet_ticks(engine)
    if used > IDLE_TICKS:
        # Once more: the thread's one-off work on going idle (writing the free sequences to
        # the prompt cache's disk tier) may have overlapped the first window; a thread that
        # keeps working fails this one too.
        used = await _quiet_ticks(engine)
    assert engine.steps == steps, f"{engine.steps - steps} decode steps while idle"
    assert used <= IDLE_TICKS, f"the idle engine thread used {used * 10} ms of CPU"
    stats = engine.stats()
    assert stats.engine_restarts == 0, "the engine restarted its context"
    assert stats.kv_cells_used == stats.prefix_cache_cells, stats


# Decode steps the engine may still run for a client that went away: its close reaches the
# handler through the event loop, and the handler's abort reaches the engine thread at the
# start of a step, while that thread steps on.
STEPS_AFTER_LEAVING = 8


async def assert_left_work_stops(engine, left_at: int, stuck_s: float = 10.0) -> None:
    """A client went away when the engine had run `left_at` decode steps: its work must end
    (nothing busy or queued) within STEPS_AFTER_LEAVING more steps. Counted in steps, not
    seconds, so that a fast machine cannot pass by finishing the work (the request's
    max_tokens must be well above what it generated before it was left) and a slow one does
    not fail by time; `stuck_s` only bounds a wait in which the engine neither steps nor
    goes idle."""
    loop = asyncio.get_running_loop()
    seen, since = left_at, loop.time()
    while True:
        stats = engine.stats()
        ran = stats.engine_steps - left_at
        assert ran <= STEPS_AFTER_LEAVING, f"{ran} decode steps after the client left: not aborted"
        if stats.busy_slots == stats.queue_length == stats.scoring_jobs == 0:
            return
        if stats.engine_steps != seen:
            seen, since = stats.engine_steps, loop.time()
        assert loop.time() - since < stuck_s, f"no step for {stuck_s} s, yet not idle: {stats}"
        await asyncio.sleep(0.002)
