"""What the API layer sees of the catalogue's models: each one's state as a plain snapshot,
and the operations GET /models and POST /models/load|unload need (`Models`, which the fleet
implements). No engine import: an API package may use this module."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class Status(StrEnum):
    """Where a model stands (as llama-server's router names it)."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


@dataclass(frozen=True)
class ModelState:
    """One model of the catalogue, now: its names, status (with the reason of a failed load),
    estimated and measured bytes, when an idle unload is due (Unix seconds), what it reads
    besides text, its GGUF file and the context it loads with."""

    id: str
    aliases: tuple[str, ...]
    status: Status
    failure: str | None
    estimated: int | None
    measured: int | None
    expires_at: float | None
    pinned: bool
    media_kinds: frozenset[str]
    path: str = ""
    n_ctx: int = 0


class Models(Protocol):
    """The operations on the catalogue an API offers."""

    @property
    def single(self) -> bool:
        """Whether the server has --model alone."""
        ...

    def states(self) -> list[ModelState]:
        """Every model, by id."""
        ...

    def rescan(self) -> None:
        """Read the catalogue anew."""
        ...

    async def load(self, name: str, path: str | None = None) -> object:
        """Load the model `name` names (from `path` when given)."""
        ...

    async def unload(self, name: str) -> object:
        """Unload the model `name` names once its running requests end."""
        ...
