"""StepClock: each lap adds the time since the last one to its phase, nothing twice."""

from __future__ import annotations

import pytest

from edgeserve.engine.step_clock import PHASES, StepClock


def test_laps_add_up_to_the_time_that_passed():
    now = iter([10.0, 10.5, 11.0, 11.25, 13.0])
    clock = StepClock(lambda: next(now))  # 10.0
    clock.begin()  # 10.5: the time before a step belongs to no phase
    clock.lap("intake")  # 11.0
    clock.lap("decode")  # 11.25
    clock.lap("intake")  # 13.0
    assert dict(clock.totals()) == {**dict.fromkeys(PHASES, 0.0), "intake": 2.25, "decode": 0.25}
    assert [phase for phase, _ in clock.totals()] == list(PHASES)


def test_an_unknown_phase_is_an_error():
    with pytest.raises(KeyError):
        StepClock().lap("idle")
