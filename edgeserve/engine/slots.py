"""Free sequence ids and the prompt cache they carry.

A finished sequence keeps its KV cells: the tokens it holds are remembered here, with the
LoRA adapter set they were computed under, and the next request under the same set that starts
with the same tokens (a second chat turn re-sending the first) takes that sequence and decodes
only what is new (what a sequence loses goes to the tiers below: prompt_store.py). Pure
bookkeeping; the scheduler does the llama.cpp calls.
"""

from __future__ import annotations

from collections.abc import Iterator

from edgeserve.engine.types import AdapterSet


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (slices compared in C, halving
    the span that holds the first difference: no Python loop over the tokens)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    same, differs = 0, n  # a[:same] == b[:same]; the first difference is before `differs`
    while differs - same > 1:
        mid = (same + differs) // 2
        if a[same:mid] == b[same:mid]:
            same = mid
        else:
            differs = mid
    return same


class SlotPool:
    """The free sequence ids, each with the tokens whose KV it still holds and the adapter
    set that KV was computed under."""

    def __init__(self, n_seq: int) -> None:
        self._held: dict[int, list[int]] = {seq: [] for seq in range(n_seq)}
        self._adapters: dict[int, AdapterSet] = dict.fromkeys(range(n_seq), ())
        self._last_used: dict[int, int] = dict.fromkeys(range(n_seq), 0)
        self._clock = 0
        self.changes = 0  # bumped by every change of which sequences are free or what they hold

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, seq: int) -> bool:
        return seq in self._held

    def __iter__(self) -> Iterator[int]:
        return iter(self._held)

    def held(self, seq: int) -> list[int]:
        """The tokens whose KV free sequence `seq` holds."""
        return self._held[seq]

    def adapters_of(self, seq: int) -> AdapterSet:
        """The adapter set the KV of free sequence `seq` was computed under."""
        return self._adapters[seq]

    def best(self, tokens: list[int], adapters: AdapterSet = ()) -> tuple[int, int]:
        """The free sequence sharing the longest prefix with `tokens`, computed under
        `adapters` (a sequence computed under another set shares nothing), and that prefix's
        length; on ties, or with no match at all, the least recently used sequence."""

        def shared(seq: int) -> int:
            return common_prefix(self._held[seq], tokens) if self._adapters[seq] == adapters else 0

        best = max(self._held, key=lambda s: (shared(s), -self._last_used[s]))
        return best, shared(best)

    def lru(self) -> int:
        """The least recently used free sequence (the emptiest on ties)."""
        return min(self._held, key=lambda s: (self._last_used[s], len(self._held[s])))

    def lru_holding(self) -> int | None:
        """The least recently used free sequence that holds tokens; None when none does."""
        holding = [s for s, tokens in self._held.items() if tokens]
        return min(holding, key=lambda s: self._last_used[s]) if holding else None

    def take(self, seq: int) -> None:
        """Take free sequence `seq` for a request (the caller trims its cells)."""
        del self._held[seq]
        self.changes += 1

    def give_back(self, seq: int, tokens: list[int], adapters: AdapterSet = ()) -> None:
        """Return a sequence whose KV holds exactly `tokens` (positions 0..len-1), computed
        under `adapters`."""
        self._clock += 1
        self._last_used[seq] = self._clock
        self._held[seq] = tokens
        self._adapters[seq] = adapters
        self.changes += 1

    def forget(self, seq: int) -> None:
        """Free sequence `seq` holds nothing any more (its cells were cleared)."""
        self._held[seq] = []
        self.changes += 1


class SharedCells:
    """Which sequences share KV cells, so that cells are counted once however many sequences
    hold them.

    Sequences come to share cells only when one is copied onto an empty one (`seq_cp`: the
    choices of an n > 1 request after their prompt), and afterwards each only grows or loses
    its tail: any two share exactly their first `shared` cells. The distinct cells of several
    sequences are then counted as the nodes of a trie of their paths.
    """

    def __init__(self, n_seq: int) -> None:
        self._shared = [[0] * n_seq for _ in range(n_seq)]
        self.changes = 0  # bumped by every copy and trim

    def copied(self, src: int, dst: int, length: int) -> None:
        """Empty sequence `dst` now holds the `length` cells of `src`."""
        shared = self._shared
        for other in range(len(shared)):
            if other != dst:
                shared[dst][other] = shared[other][dst] = shared[src][other]
        shared[dst][src] = shared[src][dst] = length
        self.changes += 1

    def trimmed(self, seq: int, length: int) -> None:
        """`seq` keeps only its first `length` cells."""
        shared = self._shared
        for other in range(len(shared)):
            shared[seq][other] = shared[other][seq] = min(shared[seq][other], length)
        self.changes += 1

    def distinct(self, lengths: dict[int, int]) -> int:
        """The distinct cells of sequences holding `lengths[seq]` cells each."""
        total = 0
        counted: list[int] = []
        for seq, length in lengths.items():
            overlap = max((self._shared[seq][other] for other in counted), default=0)
            total += length - min(overlap, length)
            counted.append(seq)
        return total


class FreeCells:
    """The distinct cells the free sequences hold (`SharedCells.distinct` over a SlotPool's
    sequences), worked out again only after the pool or the sharing changed: the engine
    publishes the figure every step, and the pairs are compared in O(n_seq²)."""

    def __init__(self) -> None:
        self._key: tuple[object, ...] = ()
        self._cells = 0

    def of(self, slots: SlotPool, sharing: SharedCells) -> int:
        """The distinct cells the free sequences of `slots` hold."""
        key = (slots, slots.changes, sharing, sharing.changes)
        if key != self._key:
            self._cells = sharing.distinct({seq: len(slots.held(seq)) for seq in slots})
            self._key = key
        return self._cells
