"""StepCost: what a decode costs, learned from measured steps (pure arithmetic, no model)."""

from __future__ import annotations

import pytest

from edgeserve.engine import step_cost
from edgeserve.engine.step_cost import StepCost


def test_step_cost_learns_what_a_row_costs():
    cost = StepCost()
    assert cost.threshold(1) == step_cost.PRIOR_THRESHOLD  # nothing measured yet
    for _ in range(20):
        cost.record(1, 0.021)
    assert cost.line() is None, "steps of one row say nothing of a row's cost"
    assert cost.generation_seconds(1) == pytest.approx(0.021)
    cpu = StepCost()  # ~this machine: 6 ms a step, 14 ms a row
    for rows in [1, 2, 1, 5, 1, 1, 8, 3] * 5:
        cpu.record(rows, 0.006 + 0.014 * rows)
    fixed, per_row = cpu.line()
    assert fixed == pytest.approx(0.006) and per_row == pytest.approx(0.014)
    assert cpu.threshold(1) == pytest.approx(0.014 / 0.020)
    assert cpu.threshold(8) == pytest.approx(0.112 / 0.118)  # busier: drafts must be surer
    gpu = StepCost()  # a row costs little beside the step
    for rows in [1, 2, 1, 5, 1, 9] * 5:
        gpu.record(rows, 0.010 + 0.0002 * rows)
    assert gpu.threshold(1) < 0.05
    noisy = StepCost()  # more rows took less time: no cost is learned below zero
    for rows, seconds in [(2, 0.02), (4, 0.01)] * 4:
        noisy.record(rows, seconds)
    assert noisy.threshold(1) == 0.0


def test_step_cost_follows_a_change_of_load():
    cost = StepCost()
    for rows in [2, 4] * 200:
        cost.record(rows, 0.010 + 0.001 * rows)
    cheap = cost.threshold(1)
    for rows in [2, 4] * 400:
        cost.record(rows, 0.010 + 0.020 * rows)  # the machine got busy
    assert cheap < 0.15 < 0.6 < cost.threshold(1)


def cpu_like() -> StepCost:
    """~this machine: 6 ms a step, 14 ms a logit row, 1.5 ms a prompt token."""
    cost = StepCost()
    for rows in [1, 2, 1, 5, 1, 1, 8, 3] * 5:
        cost.record(rows, 0.006 + 0.014 * rows)
    for rows, tokens in [(1, 16), (2, 40), (0, 300), (1, 64)] * 3:
        cost.record(rows, 0.006 + 0.014 * rows + 0.0015 * tokens, tokens)
    return cost


def test_step_cost_learns_what_a_prompt_token_costs():
    cost = StepCost()
    assert cost.token_seconds() is None and cost.generation_seconds(1) is None
    assert cost.prompt_tokens_within(1.0, 1) is None  # nothing measured: no budget
    cost = cpu_like()
    assert cost.token_seconds() == pytest.approx(0.0015)
    assert cost.generation_seconds(2) == pytest.approx(0.034)
    assert cost.row_seconds() == pytest.approx(0.014)
    # One stream (20 ms) and a budget of twice that: 20 ms of prompt tokens fit, 13 of them.
    assert cost.prompt_tokens_within(0.040, 1) == 13
    assert cost.prompt_tokens_within(0.010, 1) == 0  # the step alone is over the budget


def test_prompt_token_cost_without_a_row_line():
    # One stream, no drafts: every step has one row, so no line; the steps' own time stands
    # in for the step without prompt tokens.
    cost = StepCost()
    for _ in range(30):
        cost.record(1, 0.020)
    for tokens in (16, 32, 64) * 4:
        cost.record(1, 0.020 + 0.002 * tokens, tokens)
    assert cost.line() is None
    assert cost.generation_seconds(1) == pytest.approx(0.020)
    assert cost.token_seconds() == pytest.approx(0.002)
    assert cost.prompt_tokens_within(0.040, 1) == 10


def test_prompt_token_cost_follows_a_change_of_load():
    cost = cpu_like()
    for _ in range(800):
        cost.record(1, 0.020 + 0.006 * 32, 32)  # the machine got busy: 4x a prompt token
    assert cost.token_seconds() == pytest.approx(0.006, rel=0.05)


def test_a_row_cost_once_measured_outlasts_steps_of_one_size():
    # 4 streams without drafts for a long time: every step has 4 rows, which alone would say
    # nothing of a row's cost; the line measured before stays (else drafts would come back
    # unbounded beside the streams, and go again once measured).
    cost = cpu_like()
    for _ in range(3000):
        cost.record(4, 0.006 + 0.014 * 4)
    fixed, per_row = cost.line()
    assert fixed == pytest.approx(0.006) and per_row == pytest.approx(0.014)


def cpu_kernels() -> StepCost:
    """This machine's kernels (Gemma 3 270M, Q4_K_M, 2 cores): one row is a vector product,
    and matrix rows go four at a time, the rest one by one (see the module docstring)."""
    cost = StepCost()
    for rows in [1, 4, 8, 5, 12, 6, 16, 1, 4] * 3:
        cost.record(rows, 0.017 if rows == 1 else 0.030 + 0.0035 * rows + 0.02 * (rows % 4 > 0))
    return cost


def test_a_size_s_own_time_wins_over_the_line():
    cost = cpu_kernels()
    fixed, per_row = cost.line()
    assert cost.generation_seconds(1) == pytest.approx(0.017)  # not the line's 0.03 or more
    assert cost.generation_seconds(8) == pytest.approx(0.058)
    assert cost.generation_seconds(5) == pytest.approx(0.0675)  # slower than 8 rows
    assert cost.generation_seconds(5) > cost.generation_seconds(8)
    assert cost.generation_seconds(20) == pytest.approx(fixed + 20 * per_row)  # never stepped


def test_a_size_not_stepped_for_long_falls_back_to_the_line():
    cost = cpu_kernels()
    fixed, per_row = cost.line()
    for _ in range(200):
        cost.record(4, 0.044)
    assert cost.generation_seconds(5) == pytest.approx(0.0675), "recent enough"
    for _ in range(300):
        cost.record(4, 0.044)
    fixed, per_row = cost.line()
    assert cost.generation_seconds(5) == pytest.approx(fixed + 5 * per_row)
    assert cost.generation_seconds(4) == pytest.approx(0.044)


def test_a_curve_timed_at_load_stands_in_for_sizes_not_stepped_lately():
    # Steps of 3 and 5 rows only (drafts of 2 and 4 at one stream), the 5 slow (a row past a
    # multiple of 4): a line through them says 16 rows cost 15 ms a row, 240 ms, nearly three
    # times what they do. The curve timed at load knows better, scaled by the load now.
    stuck = StepCost()
    for rows in [3, 5, 3, 3] * 20:
        stuck.record(rows, 0.039 if rows == 3 else 0.069)
    assert stuck.generation_seconds(16) == pytest.approx(16 * 0.015)
    cost = StepCost()
    cost.calibrate([(1, 0.017), (4, 0.044), (8, 0.061), (16, 0.083)])
    assert cost.generation_seconds(16) == pytest.approx(0.083)
    assert cost.generation_seconds(12) == pytest.approx(0.072)  # between 8 and 16
    assert cost.generation_seconds(32) == pytest.approx(0.127)  # along the last segment
    for _ in range(300):
        cost.record(3, 0.039)
        cost.record(5, 0.069)
    assert cost.generation_seconds(3) == pytest.approx(0.039)  # its own time
    # (3 and 5 rows took 1.1 and 1.4 times the curve's, so 16 rows are taken to be slower too)
    assert cost.generation_seconds(16) == pytest.approx(0.105, rel=0.01)
    for _ in range(1000):  # the machine got twice as slow: the curve follows
        cost.record(4, 0.088)
    assert cost.generation_seconds(16) == pytest.approx(2 * 0.083, rel=0.05)


@pytest.mark.parametrize("seed", range(50))
def test_cheapest_is_the_least_size_and_is_worked_out_again_after_the_refresh(seed):
    import random

    rng = random.Random(seed)
    cost = StepCost()
    cost.calibrate([(rows, 0.005 + rows * rng.uniform(0.0005, 0.003)) for rows in (1, 4, 8, 16)])
    for _ in range(rng.randint(0, 40)):
        cost.record(rng.randint(1, 20), rng.uniform(0.004, 0.06))
    first, last = rng.randint(1, 8), rng.randint(8, 40)
    sizes = {rows: cost.generation_seconds(rows) for rows in range(first, last + 1)}
    least = min(sizes.values())
    assert cost.cheapest(first, last) == least
    assert cost.cheapest(last + 1, last) == 0.0, "an empty range"
    # The cheapest size made cheaper still: the old answer holds until CHEAPEST_REFRESH
    # steps are recorded, then the new one is worked out.
    cheapest_size = min(sizes, key=sizes.__getitem__)
    for step in range(step_cost.CHEAPEST_REFRESH):
        assert cost.cheapest(first, last) == least, step
        cost.record(cheapest_size, 0.0)
    now = min(cost.generation_seconds(rows) for rows in range(first, last + 1))
    assert cost.cheapest(first, last) == now < least
