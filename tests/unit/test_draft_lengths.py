"""speculation.best_lengths and keeps_pace: how many tokens each sequence of a step drafts,
from the chances its drafted tokens are kept and the step's measured cost per number of rows,
within the bound on every stream's gap between tokens; DraftSizer's skip of the lookups where
no draft keeps that bound (pure arithmetic, no model; jobs and choices are stand-ins)."""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import pytest

from edgeserve.engine.draft_sizing import DRAFT_SHARE, DraftSizer
from edgeserve.engine.speculation import Drafter, best_lengths, keeps_pace
from edgeserve.engine.step_cost import StepCost

Cost = Callable[[int], float]


# Milliseconds of one decode of 1, 2, ... 40 rows with logits, measured on this machine
# (Gemma 3 270M, Q4_K_M, 2 AVX2 cores): one row is a vector product; matrix rows go four at
# a time, the rest one by one (see step_cost.py).
CPU_MS = (
    17, 35, 42, 44, 68, 73, 79, 61, 79, 87, 92, 73, 94, 87, 95, 83, 102, 103, 103, 93,
    114, 111, 109, 95, 127, 141, 149, 128, 142, 139, 152, 129, 150, 152, 161, 137, 159, 157,
    175, 152,
)  # fmt: skip


def cpu(rows: int) -> float:
    return CPU_MS[rows - 1] / 1000


def linear(fixed: float, per_row: float) -> Cost:
    return lambda rows: fixed + per_row * rows


def chances(acceptance: float, k: int) -> list[float]:
    return [acceptance**j for j in range(1, k + 1)]


def rate(lengths: Sequence[int], kept: Sequence[Sequence[float]], cost: Cost) -> float:
    """Expected tokens per second of a step with these drafts."""
    expected = len(lengths) + sum(sum(c[:k]) for c, k in zip(kept, lengths, strict=True))
    return expected / cost(len(lengths) + sum(lengths))


def all_lengths(kept: Sequence[Sequence[float]]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(len(c) + 1) for c in kept)))


def test_a_copying_stream_alone_drafts_long_and_a_guessing_one_not_at_all():
    copying = best_lengths([chances(0.97, 16)], cpu, 32, None)
    assert copying[0] in (11, 15), "a draft that ends the step on a multiple of 4 rows"
    assert best_lengths([chances(0.5, 16)], cpu, 32, None) == [0]
    # One row more makes a matrix of a vector product: a 1-token draft never pays here.
    assert best_lengths([chances(0.99, 1)], cpu, 32, None) == [0]


def test_rows_are_cheap_on_a_gpu_so_even_unsure_tokens_are_drafted():
    gpu = linear(0.010, 0.0002)  # a row is 2% of a 4-stream step
    # The third token (kept 12.5% of the time) adds more than the step's mean per row, the
    # fourth (6%) less.
    assert best_lengths([chances(0.5, 8)] * 4, gpu, 32, 1.0) == [3, 3, 3, 3]
    # On the CPU 8 rows cost 32% more than 4: one token each pays when kept half the time,
    # not when kept 30% of the time.
    assert best_lengths([chances(0.5, 8)] * 4, cpu, 32, 1.0) == [1, 1, 1, 1]
    assert best_lengths([chances(0.3, 8)] * 4, cpu, 32, 1.0) == [0, 0, 0, 0]


def test_at_most_most_rows_in_all():
    lengths = best_lengths([chances(1.0, 16)] * 4, linear(0.01, 0.0001), 10, 1.0)
    assert sum(lengths) == 10


@pytest.mark.parametrize("seed", range(200))
def test_without_the_pace_rule_the_lengths_are_the_best_there_are(seed):
    rng = random.Random(seed)
    kept = [chances(rng.uniform(0.2, 1.0), rng.randint(0, 4)) for _ in range(rng.randint(1, 3))]
    table = {rows: rng.uniform(0.01, 0.05) + 0.004 * rows for rows in range(1, 16)}
    lengths = best_lengths(kept, table.__getitem__, 64, None)
    best = max(rate(option, kept, table.__getitem__) for option in all_lengths(kept))
    assert rate(lengths, kept, table.__getitem__) == pytest.approx(best)
    assert all(0 <= k <= len(c) for k, c in zip(lengths, kept, strict=True))


@pytest.mark.parametrize("seed", range(200))
def test_no_step_is_longer_than_the_share_allows(seed):
    rng = random.Random(seed)
    kept = [chances(rng.uniform(0.0, 1.0), rng.randint(0, 8)) for _ in range(rng.randint(1, 5))]
    share = rng.choice([0.05, 0.15, 0.5, 1.0])
    lengths = best_lengths(kept, cpu, 32, share)
    plain = cpu(len(kept))
    assert cpu(len(kept) + sum(lengths)) <= (1 + share) * plain, "every stream's gap"
    assert keeps_pace(lengths, cpu, share)
    assert rate(lengths, kept, cpu) >= rate([0] * len(kept), kept, cpu)


@pytest.mark.parametrize(("share", "most"), [(0.05, 1), (0.5, 5), (1.0, 13)])
def test_the_share_bounds_the_step_whoever_drafts(share, most):
    copying = chances(1.0, 16)
    for kept in ([copying, copying, []], [copying] * 3):
        lengths = best_lengths(kept, cpu, 32, share)
        assert cpu(3 + sum(lengths)) <= (1 + share) * cpu(3)
        assert sum(lengths) == most, "the best step within the bound: 4, 8 or 16 rows"
    assert best_lengths([copying, copying, []], cpu, 32, 1.0)[2] == 0


def test_with_the_engine_s_share_streams_beside_others_draft_on_a_gpu_not_on_this_cpu():
    copying = [chances(0.95, 16)] * 4
    # 8 rows cost 39% more than 4 here and 12 rows 20% more than 8: any draft beside three
    # or seven others would stretch every stream's gap past llama-server's.
    assert best_lengths(copying, cpu, 32, DRAFT_SHARE) == [0, 0, 0, 0]
    assert best_lengths([chances(0.95, 16)] * 8, cpu, 32, DRAFT_SHARE) == [0] * 8
    # Alone, the same stream drafts long when unbounded (a greedy stream), nothing when held
    # to the share (a sampled one: one more row costs twice a row here).
    assert best_lengths(copying[:1], cpu, 32, None)[0] >= 11
    assert best_lengths(copying[:1], cpu, 32, DRAFT_SHARE) == [0]
    gpu = linear(0.010, 0.0002)
    # A 4-row step is 10.8 ms and a row 0.2 ms: 15% longer holds 8 rows.
    assert best_lengths(copying, gpu, 32, DRAFT_SHARE) == [2, 2, 2, 2]


def test_keeps_pace_binds_a_stream_alone_too_unless_unbounded():
    assert keeps_pace([16], cpu, None) and keeps_pace([4, 4], cpu, None)
    assert not keeps_pace([1], cpu, 0.5) and keeps_pace([1], cpu, 1.1)
    assert not keeps_pace([4, 0], cpu, 0.5)
    assert keeps_pace([0, 0], cpu, 0.0) and keeps_pace([0], cpu, 0.0)
    gpu = linear(0.010, 0.0002)
    assert keeps_pace([7], gpu, DRAFT_SHARE) and not keeps_pace([8], gpu, DRAFT_SHARE)


def own_rates(lengths: Sequence[int], kept: Sequence[Sequence[float]], cost: Cost) -> list[float]:
    """Each sequence's expected tokens per second of a step with these drafts."""
    seconds = cost(len(lengths) + sum(lengths))
    return [(1 + sum(c[:k])) / seconds for c, k in zip(kept, lengths, strict=True)]


def test_greedy_streams_that_all_copy_draft_together_on_this_cpu():
    copying = [chances(0.95, 16)] * 4
    assert best_lengths(copying, cpu, 32, DRAFT_SHARE) == [0, 0, 0, 0]
    lengths = best_lengths(copying, cpu, 32, DRAFT_SHARE, by_gain=True)
    assert min(lengths) >= 3
    plain = 1 / cpu(4)
    assert min(own_rates(lengths, copying, cpu)) > 1.5 * plain  # each stream, not the sum
    # One stream that has nothing to draft holds the others to the plain bound.
    assert best_lengths([*copying[:3], []], cpu, 32, DRAFT_SHARE, by_gain=True) == [0] * 4


@pytest.mark.parametrize("seed", range(200))
def test_by_gain_no_streams_own_rate_falls_more_than_the_share(seed):
    rng = random.Random(seed)
    kept = [chances(rng.uniform(0.0, 1.0), rng.randint(0, 8)) for _ in range(rng.randint(1, 5))]
    share = rng.choice([0.0, 0.05, 0.15, 0.5])
    lengths = best_lengths(kept, cpu, 32, share, by_gain=True)
    plain = 1 / cpu(len(kept))
    assert all(r >= plain / (1 + share) - 1e-9 for r in own_rates(lengths, kept, cpu))
    assert rate(lengths, kept, cpu) >= rate([0] * len(kept), kept, cpu)


class TableCost(StepCost):
    """Measured step costs, one per number of rows (pure arithmetic: no steps recorded)."""

    def __init__(self, seconds: Sequence[float]) -> None:
        super().__init__()
        self.seconds = seconds

    def line(self) -> tuple[float, float] | None:
        return (self.seconds[0], self.seconds[1] - self.seconds[0])

    def generation_seconds(self, rows: int) -> float | None:
        return self.seconds[min(rows, len(self.seconds)) - 1]


def stepping_stand_ins(rng: random.Random, greedy: bool) -> list[tuple]:
    """Jobs and choices as the sizer reads them (stand-ins), each with a drafter that has seen
    a repetitive history and a random record of kept drafts."""
    stepping = []
    for _ in range(rng.randint(1, 8)):
        history = [rng.randint(0, 5) for _ in range(rng.randint(4, 40))]
        drafter = Drafter(history[:4])
        for _ in range(rng.randint(0, 6)):
            drafted = rng.randint(1, 8)
            drafter.adapt(drafted, rng.randint(0, drafted))
        params = SimpleNamespace(greedy=greedy, seeded=False)
        job = SimpleNamespace(
            request=SimpleNamespace(params=params), prompt=SimpleNamespace(media=(), max_new=512),
            tokens=history[:4],
        )  # fmt: skip
        choice = SimpleNamespace(
            sampler=SimpleNamespace(detached=False), drafter=drafter, n_gen=len(history) - 4,
            n_past=len(history), generated=history[4:],
        )  # fmt: skip
        stepping.append((job, choice))
    return stepping


@pytest.mark.parametrize("seed", range(300))
def test_skipping_the_lookups_when_no_draft_keeps_pace_drafts_the_same(seed, monkeypatch):
    # DraftSizer skips the n-gram lookups of a step with a sampled stream when no number of
    # drafted rows keeps its pace; the drafts must be exactly those of the full path.
    rng = random.Random(seed)
    base = rng.choice([cpu, linear(0.010, 0.0002), linear(0.006, rng.uniform(0.0, 0.003))])
    seconds = [base(rows) * rng.uniform(0.97, 1.03) for rows in range(1, 41)]
    stepping = stepping_stand_ins(rng, greedy=rng.random() < 0.2)
    spare = rng.choice([0, 3, 31, 100])
    sizer = DraftSizer(n_ctx=4096, draft_max=16, draft_model=None, offloaded=False)
    skipped = sizer.drafts(copy.deepcopy(stepping), spare, TableCost(seconds))
    monkeypatch.setattr(DraftSizer, "_pace_holds_back", staticmethod(lambda *_: False))
    full = sizer.drafts(copy.deepcopy(stepping), spare, TableCost(seconds))
    assert skipped == full


def test_a_sampled_stream_alone_on_this_cpu_looks_nothing_up_and_on_a_gpu_it_does(monkeypatch):
    lookups = []
    real = Drafter.lookup
    monkeypatch.setattr(Drafter, "lookup", lambda self, *a: lookups.append(1) or real(self, *a))
    sizer = DraftSizer(n_ctx=4096, draft_max=16, draft_model=None, offloaded=False)
    for name, base, looked in (("cpu", cpu, 0), ("gpu", linear(0.010, 0.0002), 1)):
        stepping = stepping_stand_ins(random.Random(1), greedy=False)[:1]
        lookups.clear()
        sizer.drafts(stepping, 31, TableCost([base(rows) for rows in range(1, 41)]))
        assert len(lookups) == looked, name
