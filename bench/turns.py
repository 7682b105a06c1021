"""The order in which servers (or models) take a turn: each goes first as often as the others,
so that none always runs on a machine its rival has just warmed or left busy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(items: Sequence[T], turn: int) -> list[T]:
    """`items` starting at index `turn` (modulo their count) and wrapping around."""
    if not items:
        return []
    shift = turn % len(items)
    return [*items[shift:], *items[:shift]]
