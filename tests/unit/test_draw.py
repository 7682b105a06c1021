"""`RowSampler` on made-up logit rows: seeded draws follow softmax(adjusted logits / T) within a
few sigma, by every path (the head, the tail under the envelope, the redraw in its slack);
greedy takes the best adjusted logit; the same seed draws the same tokens."""

from __future__ import annotations

import math
from dataclasses import replace

import llama_cpp as lc
import numpy as np
import pytest

from edgeserve.engine import draw
from edgeserve.engine.draw import PENALTY_LAST_N, RowSampler
from edgeserve.engine.llama import sampling
from edgeserve.engine.llama.sampling import Candidates, _build_chain
from edgeserve.engine.types import SamplingParams

VOCAB = 2048
DRAWS = 4000
WATCHED = 12
"""The likeliest tokens are checked one by one; the rest are checked together."""


def made_up_row(seed: int = 0) -> np.ndarray:
    """A logit row shaped like a model's: a few likely tokens over a broad low crowd."""
    gen = np.random.default_rng(seed)
    logits = gen.normal(-4.0, 3.0, VOCAB).astype(np.float32)
    logits[gen.choice(VOCAB, 8, replace=False)] += np.float32(9.0)
    return logits


def reference(logits: np.ndarray, params: SamplingParams, history: list[int]) -> np.ndarray:
    """softmax of the row after bias and llama.cpp's penalties, divided by T (plain loops)."""
    adjusted = logits.astype(np.float64)
    for token, bias in params.logit_bias.items():
        if token < logits.size:
            adjusted[token] += bias
    for token in set(history[-PENALTY_LAST_N:]):
        count = history[-PENALTY_LAST_N:].count(token)
        value = adjusted[token]
        value = value * params.repeat_penalty if value <= 0 else value / params.repeat_penalty
        adjusted[token] = value - count * params.frequency_penalty - params.presence_penalty
    weights = np.exp((adjusted - adjusted.max()) / params.temperature)
    return weights / weights.sum()


def assert_follows(drawn: list[int], expected: np.ndarray) -> None:
    """Each watched token's share, and the rest's, within 4.5 sigma of its probability."""
    counts = np.bincount(drawn, minlength=expected.size) / len(drawn)
    watched = np.argsort(expected)[::-1][:WATCHED]
    rest = np.ones(expected.size, dtype=bool)
    rest[watched] = False
    shares = [(int(t), counts[t], expected[t]) for t in watched]
    shares.append((-1, counts[rest].sum(), expected[rest].sum()))
    for token, share, p in shares:
        spread = 4.5 * math.sqrt(p * (1 - p) / len(drawn)) + 1 / len(drawn)
        assert abs(share - p) <= spread, (token, share, p)


def primed(params: SamplingParams, history: list[int], seed: int) -> RowSampler:
    """A sampler with `seed` that has already generated `history`."""
    sampler = RowSampler(params, VOCAB, np.random.default_rng(seed))
    for token in history:
        sampler.penalties.accept(token)
    return sampler


ROW = made_up_row()
LIKELY = [int(t) for t in np.argsort(ROW)[::-1][:4]]
CASES: dict[
    str, tuple[SamplingParams, list[int]] | tuple[SamplingParams, list[int], np.ndarray]
] = {
    "plain T=1": (SamplingParams(temperature=1.0), []),
    "T=0.7": (SamplingParams(temperature=0.7), []),
    "T=1.8": (SamplingParams(temperature=1.8), []),
    "logit_bias": (
        SamplingParams(temperature=0.7, logit_bias={LIKELY[0]: -100.0, 5: 12.0, VOCAB: 3.0}),
        [],
    ),
    "penalties": (
        SamplingParams(temperature=0.9, presence_penalty=0.8, frequency_penalty=0.6),
        [LIKELY[0]] * 3 + [LIKELY[1], 7, 7] + [11] * 70,
    ),
    "repeat penalty and bias": (
        SamplingParams(temperature=1.0, repeat_penalty=1.5, logit_bias={LIKELY[2]: 2.0}),
        [LIKELY[0], LIKELY[2], int(np.argmin(ROW))],
    ),
    "repeat penalty on negative logits": (
        SamplingParams(temperature=1.0, repeat_penalty=1.3),
        [LIKELY[0], LIKELY[1]],
        ROW - np.float32(15.0),
    ),
}


def case_of(name: str) -> tuple[SamplingParams, list[int], np.ndarray]:
    """A case's params, history and row (ROW unless the case gives one)."""
    params, history, *row = CASES[name]
    return params, history, row[0] if row else ROW


@pytest.mark.parametrize("gap", [draw.HEAD_GAP, 3.0, 0.5])
@pytest.mark.parametrize("case", CASES)
def test_draws_follow_the_adjusted_softmax(monkeypatch, case, gap):
    """At the default HEAD_GAP nearly every draw comes from the head; small gaps send most
    draws through the envelope, its tail and its redraw, which must be just as exact. The
    history is held fixed, so every draw has the same distribution."""
    monkeypatch.setattr(draw, "HEAD_GAP", gap)
    params, history, row = case_of(case)
    sampler = primed(params, history, 1)
    monkeypatch.setattr(sampler.penalties, "accept", lambda _token: None)
    drawn = [sampler.sample(row) for _ in range(DRAWS)]
    assert_follows(drawn, reference(row, params, history))


@pytest.mark.parametrize("gap", [draw.HEAD_GAP, 3.0, 0.5])
@pytest.mark.parametrize("case", CASES)
def test_many_draws_at_once_follow_the_adjusted_softmax(monkeypatch, case, gap):
    """`draws` (a grammar's rejection sampling tries them in turn) has the distribution of
    single draws, through the head, the envelope, its tail and its redraw alike; it counts
    nothing and leaves the row as it found it."""
    monkeypatch.setattr(draw, "HEAD_GAP", gap)
    params, history, row = case_of(case)
    sampler = primed(params, history, 1)
    before = row.copy()
    drawn = np.concatenate([sampler.draws(row, 100) for _ in range(DRAWS // 100)])
    assert drawn.size == DRAWS and np.array_equal(row, before)
    assert sampler.penalties._counts == primed(params, history, 1).penalties._counts
    assert_follows(drawn.tolist(), reference(row, params, history))


def test_the_row_is_never_written():
    row = ROW.copy()
    params = SamplingParams(temperature=0.7, logit_bias={3: 5.0}, presence_penalty=1.0)
    sampler = RowSampler(params, VOCAB, np.random.default_rng(0))
    for _ in range(50):
        sampler.sample(row)
    assert np.array_equal(row, ROW)


@pytest.mark.parametrize("case", CASES)
def test_greedy_takes_the_best_adjusted_logit(case):
    params, history, row = case_of(case)
    greedy = replace(params, temperature=0.0)
    expected = reference(row, replace(params, temperature=1.0), history)
    assert primed(greedy, history, 0).sample(row) == int(np.argmax(expected))


def test_greedy_breaks_ties_by_the_lowest_id():
    row = np.zeros(VOCAB, dtype=np.float32)
    row[[9, 4, 30]] = 2.0
    assert (
        RowSampler(SamplingParams(temperature=0.0), VOCAB, np.random.default_rng()).sample(row) == 4
    )


def test_penalties_count_only_the_last_window():
    params = SamplingParams(temperature=0.0, presence_penalty=50.0)
    row = np.zeros(VOCAB, dtype=np.float32)
    row[2] = 10.0
    sampler = primed(params, [2] + [3] * (PENALTY_LAST_N - 1), 0)
    assert sampler.sample(row) == 0, "token 2 is still in the window"
    sampler = primed(params, [2] + [3] * PENALTY_LAST_N, 0)
    assert sampler.sample(row) == 2, "token 2 has left the window"


def generate(params: SamplingParams, seed: int, steps: int = 40) -> list[int]:
    """`steps` tokens from rows that change with each token, as a model's do."""
    sampler = RowSampler(params, VOCAB, np.random.default_rng(seed))
    tokens = [0]
    for _ in range(steps):
        tokens.append(sampler.sample(made_up_row(tokens[-1])))
    return tokens


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), CASES["penalties"][0]])
def test_the_same_seed_draws_the_same_tokens(params):
    assert generate(params, 5) == generate(params, 5)
    assert generate(params, 5) != generate(params, 6)


@pytest.mark.parametrize(
    ("fields", "handled"),
    [
        ({}, True),
        ({"presence_penalty": 1.0, "logit_bias": {1: 2.0}}, True),
        ({"top_k": 40}, False),
        ({"top_p": 0.9}, False),
        ({"min_p": 0.05}, False),
        ({"top_k": 40, "temperature": 0.0}, True),
    ],
)
def test_truncation_stays_with_the_native_chain(fields, handled):
    assert RowSampler.handles(SamplingParams(**fields)) is handled


def native_chain_logits(params: SamplingParams, history: list[int], row: np.ndarray) -> np.ndarray:
    """The logits llama.cpp's own chain (bias → penalties → temperature) leaves for `row` after
    generating `history`, by token id."""
    chain = _build_chain(params, row.size, 0)
    candidates = Candidates(row.size)
    try:
        for token in history:
            lc.llama_sampler_accept(chain, token)
        lc.llama_sampler_apply(chain, candidates.fill(row))
        left = candidates.remaining()
        out = np.full(row.size, -np.inf, dtype=np.float32)
        out[left["id"]] = left["logit"]
        return out
    finally:
        lc.llama_sampler_free(chain)


@pytest.mark.parametrize("case", [c for c in CASES if c != "plain T=1"])
def test_the_adjustments_match_the_native_chain(case):
    """Bias and penalties are llama.cpp's own: its chain, given the same history, leaves the
    same logits (divided by T) as RowSampler draws from."""
    params, history, row = case_of(case)
    sampler = primed(params, history, 0)
    ours = adjusted_logits(sampler, row) / np.float32(params.temperature)
    np.testing.assert_allclose(ours, native_chain_logits(params, history, row), rtol=1e-5)


def adjusted_logits(sampler: RowSampler, row: np.ndarray) -> np.ndarray:
    """The logits `sampler` draws from for `row` (bias and penalties applied in place by
    `choose`); `row` must read the same afterwards."""
    seen: list[np.ndarray] = []

    def pick(logits: np.ndarray) -> int:
        seen.append(logits.copy())
        return 0

    before = row.copy()
    sampler._pick = pick  # type: ignore[method-assign]
    sampler.choose(row)
    np.testing.assert_array_equal(row, before)  # undone: the row is llama.cpp's buffer
    return seen[0]


@pytest.mark.parametrize("case", list(CASES))
def test_choose_leaves_the_row_as_it_found_it(case):
    params, history, row = case_of(case)
    sampler = primed(params, history, 0)
    before = row.copy()
    for _ in range(5):
        sampler.sample(row)
    np.testing.assert_array_equal(row, before)


def sampler_tokens(
    monkeypatch, params: SamplingParams, seed_offset: int, steps: int = 30
) -> list[int]:
    """What the engine's `Sampler` (numpy path, no model) draws from `steps` made-up rows."""
    monkeypatch.setattr(sampling, "logit_row", lambda _ctx, row, _n: made_up_row(row))
    sampler = sampling.Sampler(params, None, None, VOCAB, seed_offset=seed_offset)
    try:
        return [sampler.sample(step) for step in range(steps)]
    finally:
        sampler.free()


def test_sibling_choices_draw_as_requests_with_the_next_seeds(monkeypatch):
    """Choice i of an n>1 request with seed s draws what a request with seed s + i draws."""
    params = SamplingParams(temperature=0.7, seed=7, frequency_penalty=0.3)
    siblings = [sampler_tokens(monkeypatch, params, i) for i in range(3)]
    alone = [sampler_tokens(monkeypatch, replace(params, seed=7 + i), 0) for i in range(3)]
    assert siblings == alone
    assert len({tuple(tokens) for tokens in siblings}) == 3


@pytest.mark.parametrize("temperature", [1e-45, 1e-31, 1e31, 1e300])
def test_temperatures_past_float32s_range_draw_their_limit(temperature):
    """The API takes any temperature that is not negative: past what float32 arithmetic can
    tell apart, the draw is arg-max (tiny) or every token alike (huge), never an error."""
    row = np.array([0.0, 3.0, 1.0, 2.5], dtype=np.float32)
    sampler = RowSampler(SamplingParams(temperature=temperature), 4, np.random.default_rng(0))
    drawn = [sampler.choose(row) for _ in range(400)]
    if temperature < 1:
        assert set(drawn) == {1}
    else:
        assert set(drawn) == {0, 1, 2, 3}


def test_a_seeded_sampler_takes_its_generators_uniforms_in_order():
    """The draw's uniforms come from numpy in batches (draw.UNIFORMS), in the order single
    `random()` calls would give them: on a row of equal logits the token is floor(u · n), so
    each of 150 draws (past two batch refills) names the uniform it took."""
    size, seed = 1000, 11
    sampler = RowSampler(SamplingParams(temperature=1.0), size, np.random.default_rng(seed))
    reference = np.random.default_rng(seed)
    row = np.zeros(size, dtype=np.float32)
    for _ in range(150):
        u = reference.random()
        token = sampler.sample(row)
        if abs(u * size - round(u * size)) > 1e-6:  # clear of an interval's edge
            assert token == int(u * size)
