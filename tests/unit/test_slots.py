"""The free-sequence pool and its prompt cache (bookkeeping only)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edgeserve.engine.slots import FreeCells, SharedCells, SlotPool, common_prefix


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def _take(pool: SlotPool) -> int:
    seq = pool.lru()
    pool.take(seq)
    return seq


def test_takes_the_longest_matching_cache():
    pool = SlotPool(3)
    a = _take(pool)
    b = _take(pool)
    pool.give_back(a, [1, 2, 3, 4])
    pool.give_back(b, [1, 2, 7])
    seq, common = pool.best([1, 2, 3, 5])
    assert (seq, common) == (a, 3)
    pool.take(seq)
    assert len(pool) == 2


def test_no_match_takes_the_least_recently_used():
    pool = SlotPool(2)
    first = _take(pool)
    second = _take(pool)
    pool.give_back(first, [5])
    pool.give_back(second, [6])
    seq, common = pool.best([7])
    assert (seq, common) == (first, 0)


def test_eviction_order():
    pool = SlotPool(2)
    a = _take(pool)
    b = _take(pool)
    pool.give_back(a, [1, 2, 3])
    pool.give_back(b, [4, 5])
    assert pool.lru_holding() == a
    pool.forget(a)
    assert (pool.held(a), pool.held(b)) == ([], [4, 5])
    assert pool.lru_holding() == b
    pool.forget(b)
    assert pool.lru_holding() is None
    assert len(pool) == 2


def test_cells_shared_by_copies_count_once():
    sharing = SharedCells(4)
    sharing.copied(0, 1, 10)  # sequences 1 and 2 get sequence 0's 10 cells, then grow
    sharing.copied(0, 2, 10)
    assert sharing.distinct({0: 12, 1: 15, 2: 10}) == 10 + 2 + 5
    sharing.trimmed(2, 4)  # 2 keeps 4 of the shared cells, then grows cells of its own
    assert sharing.distinct({0: 12, 1: 15, 2: 7}) == 10 + 2 + 5 + 3
    sharing.trimmed(0, 0)  # 1 and 2 still share their first 4
    assert sharing.distinct({0: 0, 1: 15, 2: 7}) == 15 + 3
    sharing.copied(1, 3, 15)
    assert sharing.distinct({1: 15, 3: 16}) == 16
    assert sharing.distinct({2: 7, 3: 16}) == 7 + 16 - 4


N_SEQ = 3
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["take", "give_back", "forget", "copied", "trimmed"]),
        st.integers(0, N_SEQ - 1),
        st.integers(0, N_SEQ - 1),
        st.integers(1, 20),
    ),
    max_size=40,
)


@settings(max_examples=400)
@given(_OPS)
def test_free_cells_follow_every_change_of_the_pool_and_the_sharing(ops):
    # The figure kept between changes equals one worked out afresh after every operation;
    # a change that left `changes` alone would leave it stale.
    pool, sharing, kept = SlotPool(N_SEQ), SharedCells(N_SEQ), FreeCells()
    for op, seq, other, length in ops:
        if op == "take" and seq in pool:
            pool.take(seq)
        elif op == "give_back" and seq not in pool:
            pool.give_back(seq, list(range(length)))
        elif op == "forget" and seq in pool:
            pool.forget(seq)
        elif op == "copied" and seq != other:
            sharing.copied(seq, other, length)
        elif op == "trimmed":
            sharing.trimmed(seq, length)
        assert kept.of(pool, sharing) == FreeCells().of(pool, sharing)
