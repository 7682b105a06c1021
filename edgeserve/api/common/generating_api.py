"""What a generating API supplies to the one generation path (http/generation.py): its
parse and translate steps, and a `Renderer` for its wire shape. Everything else — the deadline,
admission, collecting or streaming, tool calls read from the text, log-probabilities lined up
with it, usage and the access log on every ending — is the path's, the same for every API.

`Choices` is the pure part of that path: engine events in, per-choice answers (whole) or the
renderer's stream events out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from edgeserve.api.common.logprobs import AlignedLogprob, LogprobAligner
from edgeserve.api.common.tool_calls import ToolCall, parse_tool_calls
from edgeserve.api.common.tool_stream import Content, Piece, ToolCallStream
from edgeserve.api.reference.limits import Limits
from edgeserve.engine.types import Finished, GenerationRequest, TextDelta, TokenLogprob
from edgeserve.errors import ApiError, EngineError

if TYPE_CHECKING:
    from edgeserve.api.common.call import Call

Req = TypeVar("Req")
Work = TypeVar("Work", bound="GenerationWork")
Event = TextDelta | TokenLogprob | Finished


@dataclass(frozen=True)
class GenerationWork:
    """A checked request as the engine runs it: one engine request per prompt (choice
    `position * n + j` is answer j to prompt `position`), whether `stream`ed, whether answers
    are read for `tools` calls and whether token `logprobs` go to the renderer."""

    requests: tuple[GenerationRequest, ...]
    n: int = 1
    stream: bool = False
    tools: bool = False
    logprobs: bool = False

    @property
    def choices(self) -> int:
        """How many answers the request gets."""
        return len(self.requests) * self.n


@dataclass
class TokenUsage:
    """A request's token counts so far: prompts (each counted once, whatever n is), tokens
    generated per choice (finished or not: a request cut short by its deadline, an engine error
    or its client counts what it got), and prompt tokens served from the prefix cache per
    prompt."""

    prompt_tokens: int = 0
    generated: dict[int, int] = field(default_factory=dict)
    cached: dict[int, int] = field(default_factory=dict)
    first_text_at: float | None = None

    @property
    def completion_tokens(self) -> int:
        """Generated tokens over the choices."""
        return sum(self.generated.values())

    @property
    def cached_tokens(self) -> int:
        """Cached prompt tokens over the prompts."""
        return sum(self.cached.values())

    def account(self, event: Event, n: int) -> None:
        """Count a choice's tokens and its prompt's cached tokens (as its text arrives, then at
        its end); note when the first text came."""
        if isinstance(event, TextDelta):
            self.first_text_at = self.first_text_at or time.perf_counter()
            self.generated[event.index] = max(self.generated.get(event.index, 0), event.generated)
            self.cached[event.index // n] = event.cached
        elif isinstance(event, Finished):
            self.generated[event.index] = event.completion_tokens
            self.cached[event.index // n] = event.cached_tokens


@dataclass(frozen=True)
class ChoiceEnd:
    """How a streamed choice ended: the engine's event, whether the answer was a tool call, and
    the log-probability entries no earlier event carried (None when not asked for)."""

    finished: Finished
    called: bool
    logprobs: list[AlignedLogprob] | None


@dataclass
class ChoiceAnswer:
    """One choice, whole: its generated text, how it finished (the engine's last event, and its
    reason), the tool calls read from it (None when none were asked for or found) and its
    log-probability entries."""

    text: str = ""
    reason: str = "length"
    finished: Finished | None = None
    calls: list[ToolCall] | None = None
    logprobs: list[AlignedLogprob] = field(default_factory=list)


class Renderer(Protocol):
    """An API's wire shape for one request's answer: the whole answer as a body, or a stream of
    start / pieces / finish / end events, and the event that ends a stream on a failure."""

    def aligner(self) -> LogprobAligner:
        """How this API lines log-probabilities up with the text."""
        ...

    def body(self, answers: Sequence[ChoiceAnswer], usage: TokenUsage) -> bytes:
        """The non-streamed answer."""
        ...

    def start(self) -> list[bytes]:
        """The events before any text."""
        ...

    def pieces(
        self, index: int, pieces: Sequence[Piece], logprobs: list[AlignedLogprob] | None
    ) -> list[bytes]:
        """Events for choice `index`'s next pieces; `logprobs` (None when not asked for) are
        the entries not yet sent, and are taken when any event is returned."""
        ...

    def finish(self, end: ChoiceEnd, usage: TokenUsage) -> list[bytes]:
        """Events ending a choice."""
        ...

    def end(self, usage: TokenUsage) -> list[bytes]:
        """Events after every choice finished."""
        ...

    def failure(self, err: ApiError) -> list[bytes]:
        """Events that end a started stream with `err`."""
        ...


class GenerationApi(Protocol[Req, Work]):
    """A generating API: its request checks in the reference's order, its engine work, and
    the renderer of its answers (made once every prompt is admitted)."""

    def parse(self, body: Any, limits: Limits) -> Req:
        """The decoded body as the API's wire model (422 on a schema error); `limits` say
        which media the model takes, where that changes the schema."""
        ...

    async def translate(self, req: Req, limits: Limits) -> Work:
        """Every remaining 4xx check, and the engine work of a valid request."""
        ...

    def admission_error(self, work: Work, exc: EngineError, position: int) -> ApiError:
        """The client error for prompt `position` refused by the engine."""
        ...

    async def renderer(self, req: Req, work: Work, call: Call, usage: TokenUsage) -> Renderer:
        """The renderer for this request, once its prompts are queued (`usage` has their
        tokens; an API whose answer needs more of the engine first may add to it)."""
        ...


class Choices:
    """One request's choices as their events arrive: text accumulated (collect) or handed to
    the renderer as pieces (stream), tool calls read from it when asked, log-probabilities
    released with the text that covers them."""

    def __init__(self, renderer: Renderer, work: GenerationWork) -> None:
        self._renderer = renderer
        self._aligner = renderer.aligner()
        self._logprobs = work.logprobs
        self._tools = work.tools
        self._calls = [ToolCallStream() if work.tools else None for _ in range(work.choices)]
        self._unsent: list[list[AlignedLogprob]] = [[] for _ in range(work.choices)]
        self.answers = [ChoiceAnswer() for _ in range(work.choices)]

    def collect(self, event: Event) -> None:
        """Keep the event's text, log-probabilities and finish reason."""
        answer = self.answers[event.index]
        if self._logprobs:
            answer.logprobs += self._aligner.feed(event)
        if isinstance(event, TextDelta):
            answer.text += event.text
        elif isinstance(event, Finished):
            answer.reason = event.reason
            answer.finished = event
            if self._tools:
                answer.calls = parse_tool_calls(answer.text)

    def stream(self, event: Event, usage: TokenUsage) -> list[bytes]:
        """The renderer's events for this engine event (none for a held token log-prob)."""
        index = event.index
        if self._logprobs:  # without them no TokenLogprob comes, and nothing is released
            self._unsent[index] += self._aligner.feed(event)
        if isinstance(event, TokenLogprob):
            return []
        calls = self._calls[index]
        if isinstance(event, TextDelta):
            return self._pieces(index, calls.feed(event.text) if calls else [Content(event.text)])
        events = self._pieces(index, calls.finish() if calls else [])
        end = ChoiceEnd(event, bool(calls and calls.called), self._take(index))
        return events + self._renderer.finish(end, usage)

    def _pieces(self, index: int, pieces: list[Piece]) -> list[bytes]:
        events = self._renderer.pieces(index, pieces, self._peek(index))
        if events:
            self._unsent[index] = []
        return events

    def _peek(self, index: int) -> list[AlignedLogprob] | None:
        return list(self._unsent[index]) if self._logprobs else None

    def _take(self, index: int) -> list[AlignedLogprob] | None:
        entries = self._peek(index)
        self._unsent[index] = []
        return entries
