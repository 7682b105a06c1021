"""bench.turns.rotated: over any len(items) consecutive turns each item goes first once, and
every turn is the items in their cyclic order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.turns import rotated


@given(st.lists(st.integers(), unique=True, max_size=6), st.integers(-50, 50))
def test_each_goes_first_once_a_cycle_in_cyclic_order(items, start):
    turns = [rotated(items, start + k) for k in range(len(items))]
    assert sorted(turn[0] for turn in turns) == sorted(items)
    for turn in turns:
        assert sorted(turn) == sorted(items)
        doubled = items + items
        first = items.index(turn[0])
        assert turn == doubled[first : first + len(items)]
    assert rotated(items, start) == rotated(items, start + len(items))


def test_no_items_no_turn():
    assert rotated([], 3) == []
