"""LogSoftmax against a float64 reference (pure numpy, no model)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgeserve.engine.scoring import LogSoftmax


def reference(row: np.ndarray, target: int) -> float:
    wide = row.astype(np.float64)
    peak = wide.max()
    return float(wide[target] - peak - math.log(np.exp(wide - peak).sum()))


@pytest.mark.parametrize("scale", [0.1, 3.0, 40.0])
def test_matches_float64_reference(scale: float) -> None:
    rng = np.random.default_rng(7)
    softmax = LogSoftmax(262_144)
    for _ in range(3):
        row = (rng.standard_normal(262_144) * scale).astype(np.float32)
        target = int(rng.integers(0, 262_144))
        assert softmax.logprob(row, target) == pytest.approx(reference(row, target), abs=1e-6)


def test_large_logits_do_not_overflow_and_row_is_untouched() -> None:
    row = np.array([1000.0, 999.0, -1000.0], dtype=np.float32)
    before = row.copy()
    softmax = LogSoftmax(3)
    assert softmax.logsumexp(row) == pytest.approx(1000.0 + math.log(1 + math.exp(-1)))
    assert softmax.logprob(row, 2) == pytest.approx(-2000.0 - math.log(1 + math.exp(-1)))
    assert np.array_equal(row, before)
