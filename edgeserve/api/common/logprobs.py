"""Token log-probabilities lined up with the text the engine releases.

The engine sends a TokenLogprob for each sampled token before that token's text, but holds
text back (an unfinished UTF-8 character, a possible stop string), so one TextDelta may carry
several tokens' text, or part of one. `LogprobAligner` queues each choice's entries and
releases an entry once the text released so far covers the end of its token's bytes. Entries
of tokens that a stop string swallowed are never released: they are dropped at the finish.
A token with no text (an end-of-generation token) is released at the finish when asked
(legacy completions list it, as vLLM does; chat does not, as OpenAI does not).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgeserve.engine.types import Finished, TextDelta, TokenLogprob


@dataclass(frozen=True)
class AlignedLogprob:
    """A released entry and where its token starts in the choice's text, in characters."""

    logprob: TokenLogprob
    text_offset: int


class _Choice:
    """One choice's queue and byte/character counters."""

    __slots__ = ("chars", "produced", "queue", "released")

    def __init__(self, chars: int) -> None:
        self.queue: deque[tuple[int, AlignedLogprob]] = deque()
        self.produced = 0
        self.chars = chars
        self.released = 0


class LogprobAligner:
    """Feed it every event of a generation, in order; it returns the entries each event
    releases (a TextDelta, and with `release_at_end` a Finished: the entries of trailing
    tokens without text). `start(index)` is where choice `index`'s generated text begins in
    its text, in characters (after an echoed prompt; 0 by default)."""

    def __init__(
        self, start: Callable[[int], int] | None = None, *, release_at_end: bool = False
    ) -> None:
        self._choices: dict[int, _Choice] = {}
        self._start = start
        self._release_at_end = release_at_end

    def feed(self, event: TextDelta | TokenLogprob | Finished) -> list[AlignedLogprob]:
        """Queue a TokenLogprob, release what a TextDelta covers, drop the rest at Finished
        (or with `release_at_end`, release what the text covers and drop the rest)."""
        choice = self._choices.get(event.index)
        if choice is None:
            start = self._start(event.index) if self._start else 0
            choice = self._choices[event.index] = _Choice(start)
        if isinstance(event, TokenLogprob):
            choice.produced += len(event.token)
            choice.queue.append((choice.produced, AlignedLogprob(event, choice.chars)))
            choice.chars += _characters_started(event.token)
            return []
        if isinstance(event, Finished):
            out = self._covered(choice) if self._release_at_end else []
            choice.queue.clear()
            return out
        choice.released += len(event.text.encode())
        return self._covered(choice)

    @staticmethod
    def _covered(choice: _Choice) -> list[AlignedLogprob]:
        """Dequeue the entries whose token's bytes the released text covers."""
        out = []
        while choice.queue and choice.queue[0][0] <= choice.released:
            out.append(choice.queue.popleft()[1])
        return out


def prompt_entries(tokens: Sequence[TokenLogprob]) -> list[AlignedLogprob]:
    """A scored prompt's token entries with their offsets in the prompt text, in characters."""
    out = []
    chars = 0
    for token in tokens:
        out.append(AlignedLogprob(token, chars))
        chars += _characters_started(token.token)
    return out


def _characters_started(data: bytes) -> int:
    """How many UTF-8 characters start in `data` (every byte but continuation bytes)."""
    return sum(1 for byte in data if byte & 0xC0 != 0x80)
