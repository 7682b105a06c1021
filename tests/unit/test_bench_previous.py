"""bench/previous.py: the "vs previous" ratio and the regression rule (pure, no server)."""

from __future__ import annotations

import pytest

from bench.previous import NOISE, Figure, Versus, rounds_noise, short, spread


def test_spread_is_the_range_over_the_median():
    assert spread([10.0, 12.0, 11.0]) == pytest.approx(2 / 11)
    assert spread([10.0, None, 12.0]) == pytest.approx(2 / 11)


def test_spread_needs_two_rounds_and_a_nonzero_median():
    assert spread([10.0]) is None
    assert spread([]) is None
    assert spread([0.0, 0.0]) is None


def test_rounds_noise_is_the_larger_spread_else_the_fixed_threshold():
    assert rounds_noise([10.0, 11.0], [20.0, 20.0]) == pytest.approx(1 / 10.5)
    assert rounds_noise([10.0, 11.0], [20.0]) == NOISE
    assert rounds_noise([], []) == NOISE
    assert NOISE == 0.05


@pytest.mark.parametrize(
    ("ours", "base", "higher", "regressed"),
    [
        (94.0, 100.0, True, True),  # 6% fewer tok/s
        (96.0, 100.0, True, False),  # 4%: within 5%
        (120.0, 100.0, True, False),  # better
        (106.0, 100.0, False, True),  # 6% more ms
        (104.0, 100.0, False, False),
        (80.0, 100.0, None, False),  # no direction: shown only
        (None, 100.0, True, False),  # not measured
        (90.0, None, True, False),
    ],
)
def test_regressed_beyond_the_fixed_noise(ours, base, higher, regressed):
    assert Figure("f", ours, base, higher).regressed() is regressed


def test_regressed_beyond_the_rounds_spread():
    assert not Figure("f", 90.0, 100.0, True, noise=0.12).regressed()
    assert Figure("f", 87.0, 100.0, True, noise=0.12).regressed()


def test_counts_regress_on_any_increase_even_from_zero():
    assert Figure("cut short", 1.0, 0.0, False, noise=0.0).regressed()
    assert Figure("cut short", 3.0, 2.0, False, noise=0.0).regressed()
    assert not Figure("cut short", 0.0, 0.0, False, noise=0.0).regressed()
    assert not Figure("cut short", 0.0, 2.0, False, noise=0.0).regressed()


def test_a_floor_keeps_jitter_near_zero_out():
    assert not Figure("idle CPU %", 0.9, 0.1, False, floor=1.0).regressed()
    assert Figure("idle CPU %", 2.5, 0.1, False, floor=1.0).regressed()


def test_ratio_is_edgeserve_over_the_baseline():
    assert Figure("f", 90.0, 100.0, True).ratio == "0.90"
    assert Figure("f", 90.0, 0.0, True).ratio == "-"
    assert Figure("f", None, 100.0, True).ratio == "-"


def test_regression_line_names_the_figure_values_and_noise():
    line = Figure("c=4 aggregate tok/s", 80.0, 100.0, True, noise=0.031).line()
    assert line == "  c=4 aggregate tok/s: 80.0 vs 100.0, 20.0% worse (noise 3.1%)"
    line = Figure("cut short", 2.0, 0.0, False, "{:.0f}", noise=0.0).line()
    assert line == "  cut short: 2 vs 0, from 0 worse (noise 0.0%)"


def test_figure_json_has_the_verdict():
    data = Figure("f", 80.0, 100.0, True).to_json()
    assert data["regressed"] is True
    assert data["ratio"] == "0.80"
    assert (data["ours"], data["base"]) == (80.0, 100.0)


def test_versus_records_only_with_a_baseline():
    off = Versus(active=False)
    assert off.ratio(Figure("f", 1.0, 2.0, True)) is None
    assert off.note(Figure("f", 1.0, 2.0, True)) == ""
    assert off.figures == []
    assert off.text("abc") == []


def test_versus_text_lists_the_regressions_or_says_none():
    versus = Versus(active=True)
    assert versus.note(Figure("fine", 100.0, 100.0, True)) == ", vs previous 1.00"
    assert versus.text("abc123 Subject") == [
        "Regressions vs previous (edgeserve-baseline abc123 Subject): none beyond the noise "
        "(1 figures compared)"
    ]
    versus.ratio(Figure("slower", 50.0, 100.0, True))
    text = versus.text(None)
    assert text[0].startswith("Regressions vs previous (edgeserve-baseline): 1 of 2 figures")
    assert text[1:] == ["  slower: 50.0 vs 100.0, 50.0% worse (noise 5.0%)"]
    assert [f.label for f in versus.regressions()] == ["slower"]


def test_figures_one_server_did_not_measure_are_not_counted():
    versus = Versus(active=True)
    assert versus.ratio(Figure("only ours", 1.0, None, True)) == "-"
    assert versus.figures == []


def test_short_revision_keeps_twelve_digits_and_a_cut_subject():
    sha = "1045ed8e5a66eb6ff94e4e1ab4d305b43e4585f4"
    assert short(f"{sha} Fix it") == "1045ed8e5a66 Fix it"
    cut = short(f"{sha} {'word ' * 30}", width=20)
    assert cut == "1045ed8e5a66 word word word wo..."
    assert short(sha) == "1045ed8e5a66"
