"""edgeserve's engine phase clock over a load run, read from its /metrics: the milliseconds a
step spends in each phase, outside llama_decode in all (the engine's own work), and waiting for
the event loops to send its tokens (README: where a step's time goes)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import aiohttp

from bench.anchors import EDGESERVES


class Stamped(Protocol):
    """A run's result that takes the figures (load.RunResult)."""

    server: str
    engine_phases_ms: dict[str, float] | None
    engine_step_ms: float | None
    loop_wait_ms: float | None


# edgeserve's engine counters in its /metrics (summed over the models' label sets)
_ENGINE_METRIC = re.compile(
    r"^edgeserve_engine_(steps_total|phase_seconds_total)(?:\{([^}]*)\})? (\S+)$", re.MULTILINE
)
_PHASE = re.compile(r'phase="([^"]+)"')


def read_engine_clock(metrics: str) -> dict[str, float]:
    """The engine's decode count ("steps") and the seconds of each phase of its steps, from
    the text of edgeserve's /metrics."""
    clock: dict[str, float] = {}
    for name, labels, value in _ENGINE_METRIC.findall(metrics):
        phase = _PHASE.search(labels or "")
        key = "steps" if name == "steps_total" else phase.group(1) if phase else None
        if key is not None:
            clock[key] = clock.get(key, 0.0) + float(value)
    return clock


def per_step_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """Milliseconds a step in each phase between two readings of `read_engine_clock`, and
    "outside_decode", the engine's own: the sum of all but llama_decode's and the wait for the
    event loops ("loops"); None without a step between them."""
    steps = after.get("steps", 0.0) - before.get("steps", 0.0)
    if steps <= 0:
        return None
    phases = {
        k: 1000.0 * (v - before.get(k, 0.0)) / steps for k, v in after.items() if k != "steps"
    }
    own = sum(v for k, v in phases.items() if k not in ("decode", "loops"))
    return phases | {"outside_decode": own}


class EngineClocks:
    """The edgeserves' engine clocks over a run: read at its start and end, put on its
    results (`RunResult.engine_phases_ms`, `engine_step_ms`, `loop_wait_ms`)."""

    def __init__(self, http: aiohttp.ClientSession, servers: Sequence[tuple[str, str]]) -> None:
        self.http = http
        self.servers = [(kind, url) for kind, url in servers if kind in EDGESERVES]
        self.before: dict[str, dict[str, float]] = {}

    async def read(self) -> dict[str, dict[str, float]]:
        """Every edgeserve's clock now."""
        clocks = {}
        for kind, url in self.servers:
            async with self.http.get(url + "/metrics") as resp:
                clocks[kind] = read_engine_clock(await resp.text())
        return clocks

    async def start(self) -> None:
        """The run begins."""
        self.before = await self.read()

    async def stamp(self, runs: Sequence[Stamped]) -> None:
        """The run is over: each edgeserve's milliseconds a step on its result."""
        after = await self.read()
        for run in runs:
            if run.server in after:
                phases = per_step_ms(self.before[run.server], after[run.server])
                run.engine_phases_ms = phases
                run.engine_step_ms = phases["outside_decode"] if phases else None
                run.loop_wait_ms = phases.get("loops") if phases else None
