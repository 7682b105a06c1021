"""The llama.cpp backend's own count of the KV cells in use (engine/llama/cells.py): pure
Python, so it is checked here without a model."""

from __future__ import annotations

from edgeserve.engine.llama.cells import CellLedger


def test_a_cell_shared_by_copies_counts_once_until_no_sequence_holds_it():
    ledger = CellLedger()
    ledger.stored(0, 0, 10)
    ledger.copied(0, 1)
    ledger.copied(0, 2)
    assert ledger.used == 10
    ledger.stored(1, 10, 3)
    ledger.stored(2, 10, 2)
    assert ledger.used == 15
    ledger.removed(0, -1, -1)
    assert ledger.used == 15  # 1 and 2 still hold the prompt's cells
    ledger.removed(1, 4, -1)
    assert ledger.used == 12  # its own 3 go; the 6 shared ones stay with 2
    ledger.removed(2, -1, -1)
    assert ledger.used == 4
    ledger.removed(1, 1, 3)  # a hole in the middle
    assert ledger.used == 2


def test_a_copy_onto_a_sequence_that_holds_cells_keeps_them():
    ledger = CellLedger()
    ledger.stored(0, 0, 5)
    ledger.stored(1, 0, 2)
    ledger.copied(0, 1)
    assert ledger.used == 7
    ledger.removed(0, -1, -1)
    assert ledger.used == 7
    ledger.removed(1, 2, -1)  # positions 0 and 1: its own two cells and two shared ones
    assert ledger.used == 4
    ledger.clear()
    assert ledger.used == 0
