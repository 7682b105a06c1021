"""Checkpoints of sliding-window caches, so that a cached prompt prefix stays reusable.

On models with sliding-window attention (Gemma 3: 5 of every 6 layers attend to the last 512
positions), llama.cpp sizes those layers' caches by the window rather than by the context
(`swa_full` off) and hands the cells a window has left behind to other tokens. A sequence
then still holds every position in its full-attention layers, but only its last window in
the others: a later request sharing only an earlier part of its tokens (the same system
prompt with another question, a chat turn that rewrote the last answer) cannot go on from
that part, since the window there is gone.

So while a prompt is decoded, the window of its sequence is copied out now and then (at
every `spacing` positions, where the prompt's last message and that message's last line start,
and before its last tokens: `due`), and a prefix whose window is gone is reused from the latest
checkpoint at or before its end: the window is put back and the tokens after the checkpoint
are decoded again. A checkpoint holds one window (at most n_swa cells of the sliding layers:
llama.cpp copies out only the cells the sequence's last position still attends to) and stays
valid while its sequence keeps the positions before it; all of them together hold at
most `budget` cells (the memory the smaller caches save, so that the KV never takes more than
full-size caches would), the oldest going first.

Pure bookkeeping: the backend's state is an opaque handle here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

# Checkpoints one sequence keeps at most (its oldest goes first).
MAX_PER_SEQUENCE = 8


@dataclass
class Checkpoint:
    """The window of a sequence's sliding layers as it was before `position`."""

    seq: int
    position: int
    cells: int
    state: object


class WindowCheckpoints:
    """Every sequence's checkpoints, oldest first, within a budget of cells."""

    def __init__(self, budget: int, n_swa: int) -> None:
        self.budget = budget
        self.n_swa = n_swa
        self._kept: list[Checkpoint] = []
        self.cells = 0

    @property
    def enabled(self) -> bool:
        """True when checkpoints are taken (a sliding window and room for one of them)."""
        return self.n_swa > 0 and self.budget >= self.n_swa

    @property
    def spacing(self) -> int:
        """Positions between a prompt's checkpoints (0: none are taken)."""
        return self.n_swa if self.enabled else 0

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[Checkpoint]:
        """Every sequence's checkpoints, oldest first."""
        return iter(self._kept)

    def of(self, seq: int) -> list[Checkpoint]:
        """The checkpoints of `seq`, oldest first."""
        return [c for c in self._kept if c.seq == seq]

    def due(self, seq: int, position: int, tail_start: int, marks: tuple[int, ...] = ()) -> bool:
        """Whether to take one for `seq` before `position` of a prompt whose last tokens,
        decoded together, start at `tail_start` (Prompt.tail): at each multiple of `spacing`,
        at the prompt's `marks` (where its last message and that message's last line start)
        and before those last tokens, once per position; not where MAX_PER_SEQUENCE later
        ones of the same prompt would push it out before the prompt ends (~3 ms a copy on
        Gemma 3 270M: four of twelve on a ~5,900-token prompt)."""
        if not self.enabled or position <= 0 or position > tail_start:
            return False
        if position % self.spacing and position != tail_start and position not in marks:
            return False
        if len(self._later(position, tail_start, marks)) >= MAX_PER_SEQUENCE:
            return False
        return all(c.position != position for c in self.of(seq))

    def _later(self, position: int, tail_start: int, marks: tuple[int, ...]) -> set[int]:
        """The positions after `position` where the same prompt takes one (see `due`)."""
        first = position - position % self.spacing + self.spacing
        later = set(range(first, tail_start + 1, self.spacing))
        return later | {m for m in marks if position < m <= tail_start} | {tail_start}

    def add(self, seq: int, position: int, state: object) -> None:
        """Keep a new checkpoint, making room for it."""
        cells = min(position, self.n_swa)
        mine = self.of(seq)
        if len(mine) >= MAX_PER_SEQUENCE:
            self._drop(mine[0])
        while self._kept and self.cells + cells > self.budget:
            self._drop(self._kept[0])
        self._kept.append(Checkpoint(seq, position, cells, state))
        self.cells += cells

    def best(self, seq: int, position: int) -> Checkpoint | None:
        """The latest checkpoint of `seq` at or before `position`."""
        usable = [c for c in self.of(seq) if c.position <= position]
        return max(usable, key=lambda c: c.position, default=None)

    def trimmed(self, seq: int, keep: int) -> None:
        """`seq` keeps only its first `keep` positions (-1: none): later checkpoints go."""
        for checkpoint in self.of(seq):
            if checkpoint.position > keep:
                self._drop(checkpoint)

    def clear(self) -> None:
        """Forget every checkpoint (the context was made anew)."""
        self._kept = []
        self.cells = 0

    def _drop(self, checkpoint: Checkpoint) -> None:
        self._kept.remove(checkpoint)
        self.cells -= checkpoint.cells
