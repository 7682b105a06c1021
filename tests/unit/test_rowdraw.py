"""The compiled draw (`_rowdraw.draw`) against the same arithmetic in float64 numpy: for any
row, temperature, gap and uniform it picks the token whose interval of the running sum of
exp((logit - best) / T) holds the uniform's point, within float32's precision (its exp is a
polynomial of its own), with the tokens outside the gap of the best logit drawn through the
envelope and its slack exactly as rejection sampling needs."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeserve.engine._rowdraw import draw
from edgeserve.engine.draw import DRAW_BLOCK

EDGE = 1e-5
"""Points this close (relative to the mass) to an interval's edge may go either way."""


def scratch(size: int) -> np.ndarray:
    """draw's scratch for a row of `size`."""
    return np.empty(2 * -(-size // DRAW_BLOCK), dtype=np.float64)


def no_second_uniform() -> float:
    raise AssertionError("a point in the mass needs no second uniform")


def inside_the_gap(row: np.ndarray, temperature: float, gap: float) -> np.ndarray:
    """Which tokens the draw weighs: within `gap` (in units of T) of the best logit, worked
    out in float32 as the draw does."""
    inverse = np.float32(1) / np.float32(temperature)
    return (row - row.max()) * inverse >= -np.float32(gap)


def exact(row: np.ndarray, temperature: float, gap: float, u: float) -> tuple[int, np.ndarray]:
    """(the token, or -1 for a point past the mass, or -2 for one within EDGE of an interval's
    edge; every token's weight), in float64."""
    inverse = np.float32(1) / np.float32(temperature)
    weights = np.exp(((row - row.max()) * inverse).astype(np.float64))
    inside = inside_the_gap(row, temperature, gap)
    mass = float(weights[inside].sum())
    envelope = (row.size - int(inside.sum())) * math.exp(-float(np.float32(gap)))
    point = u * (mass + envelope)
    if point >= mass and not inside.all():
        beyond = np.cumsum(weights[~inside])
        if np.min(np.abs(beyond - (point - mass)), initial=np.inf) <= EDGE * mass:
            return -2, weights
        found = int(np.searchsorted(beyond, point - mass, side="right"))
        return (int(np.flatnonzero(~inside)[found]) if found < beyond.size else -1), weights
    running = np.cumsum(np.where(inside, weights, 0.0))
    if np.min(np.abs(running - point)) <= EDGE * mass:
        return -2, weights
    return min(int(np.searchsorted(running, point, side="right")), row.size - 1), weights


rows = st.integers(1, 300).flatmap(
    lambda size: st.lists(st.floats(-40.0, 40.0, width=32), min_size=size, max_size=size).map(
        lambda values: np.array(values, dtype=np.float32)
    )
)


@settings(max_examples=600, deadline=None)
@given(
    row=rows,
    temperature=st.sampled_from([0.05, 0.7, 1.0, 2.5]),
    gap=st.sampled_from([0.5, 3.0, 20.0]),
    u=st.floats(0.0, 1.0, exclude_max=True),
    second=st.floats(0.0, 1.0, exclude_max=True),
)
def test_a_draw_picks_what_exact_arithmetic_does(row, temperature, gap, u, second):
    """Rows of every length around the vectors and blocks (their remainders included), best
    logits early and late, ties, gaps that leave one token in and that leave most out;
    points in the mass, in the envelope's tokens and in its slack (then the second uniform
    draws from the whole distribution)."""
    expected, weights = exact(row, temperature, gap, u)
    token = draw(row, temperature, gap, u, lambda: second, scratch(row.size))
    if expected == -1:
        cumulative = np.cumsum(weights)
        point = second * cumulative[-1]
        if np.min(np.abs(cumulative - point)) > EDGE * cumulative[-1]:
            assert token == int(np.searchsorted(cumulative, point, side="right"))
    elif expected >= 0:
        assert token == expected
    assert 0 <= token < row.size


def test_exp_is_within_two_ulp():
    """The vectors' exp, through a draw from a two-token row [0, x]: the mass is 1 + e^x as
    the vectors weigh it, and the point u (1 + e^x) takes token 0 only below 1, so the
    uniforms 2 ulp either side of 1 / (1 + e^x) tell the vectors' e^x from float64's by any
    more than 2 ulp. Offsets over [-2, 0] reach every value the polynomial works on (|r| <=
    ln2 / 2); beyond, a power of two scales it exactly."""
    for x in np.linspace(-2.0, 0.0, 20_001, dtype=np.float32)[:-1]:
        w = math.exp(float(x))
        margin = 2 * float(np.spacing(np.float32(w))) / (1 + w)
        row = np.array([0.0, x], dtype=np.float32)
        below = draw(row, 1.0, 20.0, (1 - margin) / (1 + w), no_second_uniform, scratch(2))
        above = draw(row, 1.0, 20.0, (1 + margin) / (1 + w), no_second_uniform, scratch(2))
        assert (below, above) == (0, 1), x


def test_the_blocks_before_the_best_keep_their_share():
    """With the best logit in the last block, every earlier block's tokens keep their exact
    share: each block is weighed against the row's best, not the best seen so far."""
    row = np.zeros(64 * 5, dtype=np.float32)
    row[-1] = 3.0
    shares = np.exp(row.astype(np.float64) - 3.0)
    cumulative = np.cumsum(shares) / shares.sum()
    for token in (0, 70, 200, 318, 319):
        u = (cumulative[token] + (cumulative[token - 1] if token else 0.0)) / 2
        assert draw(row, 1.0, 20.0, u, no_second_uniform, scratch(row.size)) == token


def test_a_point_in_the_envelope_takes_a_token_outside_the_gap_or_draws_again():
    row = np.zeros(64, dtype=np.float32)
    row[10] = 50.0  # one token in the gap, weight 1; 63 outside it at e^-50 each
    envelope = 63 * math.exp(-20.0)
    total = 1 + envelope
    assert draw(row, 1.0, 20.0, 0.5, no_second_uniform, scratch(64)) == 10
    # Past the mass by less than the 63 tokens' exact weight: the first of them.
    first = (1 + 0.5 * math.exp(-50.0)) / total
    assert draw(row, 1.0, 20.0, first, no_second_uniform, scratch(64)) == 0
    # In the slack: a second uniform, from the whole distribution (token 10 all but surely).
    seconds = iter([0.25])
    assert draw(row, 1.0, 20.0, 0.9999999999, lambda: next(seconds), scratch(64)) == 10


def test_the_engine_row_views_are_taken_as_they_are():
    """llama.cpp's rows reach the draw as numpy views of ctypes arrays (logit_rows.py), whose
    buffers spell out their byte order; and a read-only row is only read."""
    values = (ctypes.c_float * 5)(0.0, 3.0, 1.0, 3.5, -2.0)
    view = np.ctypeslib.as_array(values)
    view.flags.writeable = False
    before = view.copy()
    assert draw(view, 1.0, 20.0, 0.0, no_second_uniform, scratch(5)) == 0
    assert draw(values, 1.0, 20.0, 0.9, no_second_uniform, scratch(5)) == 3
    np.testing.assert_array_equal(view, before)


def test_a_failing_second_uniform_is_raised():
    row = np.array([50.0, 0.0], dtype=np.float32)

    def broken() -> float:
        raise RuntimeError("no uniform")

    with pytest.raises(RuntimeError, match="no uniform"):
        draw(row, 1.0, 20.0, 0.99999999999, broken, scratch(2))


@pytest.mark.parametrize(
    ("row", "temperature", "gap", "buffer", "error"),
    [
        (np.zeros(8, np.float64), 1.0, 20.0, None, "the row must hold float32"),
        (np.zeros(16, np.float32)[::2], 1.0, 20.0, None, "contiguous"),
        (np.zeros(0, np.float32), 1.0, 20.0, None, "the row is empty"),
        (np.full(8, -np.inf, np.float32), 1.0, 20.0, None, "no finite logit"),
        (np.zeros(8, np.float32), 0.0, 20.0, None, "temperature must be positive"),
        (np.zeros(8, np.float32), 1e-40, 20.0, None, "temperature must be positive"),
        (np.zeros(8, np.float32), 1.0, 0.0, None, "gap must be"),
        (np.zeros(8, np.float32), 1.0, 81.0, None, "gap must be"),
        (np.zeros(65, np.float32), 1.0, 20.0, np.empty(3), "scratch shorter"),
        (np.zeros(8, np.float32), 1.0, 20.0, np.empty(2, np.float32), "scratch must"),
    ],
)
def test_what_it_refuses(row, temperature, gap, buffer, error):
    buffer = scratch(max(row.size, 1)) if buffer is None else buffer
    with pytest.raises((TypeError, ValueError), match=error):
        draw(row, temperature, gap, 0.5, no_second_uniform, buffer)


def test_read_only_scratch_is_refused():
    buffer = scratch(8)
    buffer.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        draw(np.zeros(8, dtype=np.float32), 1.0, 20.0, 0.5, no_second_uniform, buffer)
