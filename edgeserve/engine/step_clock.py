"""Where the engine thread's time goes, phase by phase (published in `/metrics`).

A step's wall time is cut at a handful of points (one `perf_counter` each, ~0.1 µs), and each
stretch is added to the phase it belongs to:

- intake: new requests, cancels and calls from the inbox, arrived grammar samples, admission;
- plan: the scheduler's invariants, the plan and its batch, committing the decoded positions;
- decode: `llama_decode` (generation, media, scoring and embeddings steps);
- sample: reading logit rows and sampling (or verifying drafts);
- account: each token's bookkeeping: end of generation, its text, stop strings, log-probs;
- deliver: the snapshot for /health and handing the step's events to the event loops;
- loops: on the CPU, waiting for the event loops to send the step's events before the next
  decode (the HTTP side's work, not the engine's).

Everything but `decode` and `loops` is the engine's own work, which a one-stream decode waits
for; `loops` it waits for too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

PHASES = ("intake", "plan", "decode", "sample", "account", "deliver", "loops")


class StepClock:
    """Running seconds per phase (engine thread only; `totals` is read from any thread)."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._timer = timer
        self._mark = timer()

    def begin(self) -> None:
        """A step starts: what follows is timed from now."""
        self._mark = self._timer()

    def lap(self, phase: str) -> None:
        """The time since the last lap (or `begin`) was spent in `phase`."""
        now = self._timer()
        self.seconds[phase] += now - self._mark
        self._mark = now

    def now(self) -> float:
        """The clock's time now (seconds)."""
        return self._timer()

    def totals(self) -> tuple[tuple[str, float], ...]:
        """(phase, seconds) in PHASES order."""
        return tuple(self.seconds.items())
