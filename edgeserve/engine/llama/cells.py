"""The generation context's KV cells, as the backend filled and trimmed them.

llama.cpp (0.3.36) has no call that counts the cells in use (`llama_kv_self_used_cells` is
gone from its memory API), and summing each sequence's position range counts a cell that
`seq_cp` shares once per sequence. So the backend keeps its own account, call by call: every
cell a successful decode stores, every cell `seq_cp` shares and `seq_rm` drops; a cell is in
use while some sequence holds it, as in llama.cpp's unified cache.
"""

from __future__ import annotations

import bisect
from collections import defaultdict


class CellLedger:
    """Which cells each sequence holds, in position order, and how many sequences hold each
    cell."""

    def __init__(self) -> None:
        self._seqs: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)  # (pos, cell)
        self._holders: dict[int, int] = {}  # cell -> sequences holding it
        self._next = 0

    @property
    def used(self) -> int:
        """The distinct cells some sequence holds."""
        return len(self._holders)

    def stored(self, seq: int, pos: int, n: int) -> None:
        """A decode stored `n` new cells for `seq`, at positions `pos` … `pos + n - 1`."""
        cells = range(self._next, self._next + n)
        self._next += n
        self._seqs[seq].extend(zip(range(pos, pos + n), cells, strict=True))
        self._holders.update(dict.fromkeys(cells, 1))

    def removed(self, seq: int, p0: int, p1: int) -> None:
        """`seq` let go of its positions [p0, p1) (-1: open end)."""
        held = self._seqs[seq]
        start = bisect.bisect_left(held, (max(p0, 0), -1))
        if p1 < 0:
            dropped = held[start:]
            del held[start:]
        else:
            end = bisect.bisect_left(held, (p1, -1))
            dropped = held[start:end]
            del held[start:end]
        for _, cell in dropped:
            self._release(cell)

    def copied(self, src: int, dst: int) -> None:
        """`dst` now holds every cell of `src` too."""
        mine = self._seqs[dst]
        have = {cell for _, cell in mine}
        new = [entry for entry in self._seqs[src] if entry[1] not in have]
        for _, cell in new:
            self._holders[cell] += 1
        self._seqs[dst] = sorted(mine + new) if mine else new

    def clear(self) -> None:
        """Every sequence is empty."""
        self._seqs.clear()
        self._holders.clear()

    def _release(self, cell: int) -> None:
        left = self._holders[cell] - 1
        if left:
            self._holders[cell] = left
        else:
            del self._holders[cell]
