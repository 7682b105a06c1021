"""Per-request and per-choice state inside the engine thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgeserve.engine.detok import StopMatcher, Utf8Assembler
from edgeserve.engine.sampling import Sampler
from edgeserve.engine.types import GenerationRequest


class Sink:
    """Where a request's events go: an asyncio queue on a given event loop."""

    __slots__ = ("loop", "put")

    def __init__(self, loop: Any, put: Any) -> None:
        self.loop = loop
        self.put = put


@dataclass(eq=False)
class Choice:
    """One generated answer: its sequence id, sampler and text state."""

    index: int
    seq_id: int
    sampler: Sampler
    stops: tuple[str, ...]
    n_past: int = 0
    n_gen: int = 0
    last_token: int = -1
    done: bool = False
    generated: list[int] = field(default_factory=list)
    assembler: Utf8Assembler = field(default_factory=Utf8Assembler)
    stopper: StopMatcher = field(init=False)

    def __post_init__(self) -> None:
        self.stopper = StopMatcher(self.stops)


@dataclass(eq=False)
class Job:
    """A generation request from admission to its last choice."""

    rid: int
    request: GenerationRequest
    sink: Sink
    tokens: list[int] = field(default_factory=list)
    max_new: int = 0
    reserve: int = 0
    prefilled: int = 0
    cached: int = 0
    gbnf: str | None = None
    choices: list[Choice] = field(default_factory=list)
    cancelled: bool = False

    @property
    def prefilling(self) -> bool:
        """True until every prompt token has been decoded."""
        return self.prefilled < len(self.tokens)

    @property
    def finished(self) -> bool:
        """True once every choice has ended."""
        return bool(self.choices) and all(c.done for c in self.choices)
