"""Work inside the engine: a generation or score request from submission to its end.

A job moves through one state machine, and the scheduler keeps it in exactly one live
collection per state (waiting, active or scoring) and in none once it has ended::

    QUEUED ──admitted──▶ PREFILLING ──last prompt chunk──▶ GENERATING ──every choice ended──▶ DONE
       │                     │                                 │
       └─────────────────────┴──── cancelled or failed ────────┴──────────────────▶ CANCELLED

A score or embeddings job goes QUEUED → GENERATING (being decoded) → DONE, or CANCELLED from
either.
Everything here belongs to the engine thread except `Sink`, which is how events leave it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edgeserve.engine.detok import StopMatcher, Utf8Assembler
from edgeserve.engine.ports import EmbedSpan, SamplerHandle
from edgeserve.engine.scoring import TextState
from edgeserve.engine.speculation import DraftPace
from edgeserve.engine.types import (
    EmbedRequest,
    EmbedResult,
    GenerationRequest,
    ScoreRequest,
    ScoreResult,
    TokenLogprob,
)


class JobState(enum.Enum):
    """Where a job is in its life (see the module docstring)."""

    QUEUED = "queued"
    PREFILLING = "prefilling"
    GENERATING = "generating"
    DONE = "done"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        """True for DONE and CANCELLED: the job holds nothing and is in no collection."""
        return self in (JobState.DONE, JobState.CANCELLED)


class EventLoop(Protocol):
    """The one method of an asyncio loop the engine thread may call."""

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any) -> object: ...


@dataclass(frozen=True, slots=True)
class Sink:
    """Where a request's events go: `put` called on `loop` (an asyncio queue's put_nowait)."""

    loop: EventLoop
    put: Callable[[object], None]


# A detached sample in flight: its future and the logit row it reads.
Pending = tuple[Future[int | None], np.ndarray]


# The text after a prompt's last media item, up to this many tokens, is decoded in one chunk.
SHORT_TAIL = 64


def prompt_tail(n_prompt: int, row_multiple: int) -> int:
    """How many last tokens of a prompt of `n_prompt` tokens are decoded together
    (`Prompt.tail`): one, and as many more as leave the chunk before them a multiple of
    `row_multiple` long (it starts at one: at 0, a checkpoint position, a mark or a multiple
    of CHUNK_ALIGN, all multiples of it, unless a prefix cache hit ends elsewhere)."""
    return 1 + (n_prompt - 1) % row_multiple if n_prompt > 0 else 1


@dataclass(frozen=True, slots=True)
class MediaSpan:
    """An image or clip in a prompt: its projector embeddings (one row per position), decoded
    at positions `start` … `start + n - 1` in place of tokens. The prompt's tokens there are
    ids no vocabulary has, made from the media's digest (`media_ids`), so a prefix match
    reuses the same media's cells and never another's."""

    start: int
    embeddings: np.ndarray
    non_causal: bool

    @property
    def n(self) -> int:
        """The positions it takes."""
        return len(self.embeddings)

    @property
    def end(self) -> int:
        """The first position after it."""
        return self.start + self.n


def media_ids(digest: bytes, n: int) -> list[int]:
    """The stand-in token ids of a media item's `n` positions: negative, so never a token,
    and each a function of the digest and the position within the item."""
    base = int.from_bytes(digest[:8], "little") >> 2
    return [-1 - ((base + i) % (1 << 62)) for i in range(n)]


@dataclass(frozen=True, slots=True)
class Prompt:
    """A generation request made ready for the engine off its thread (rendered, tokenized,
    its media encoded, its grammar checked) and sized against the context."""

    tokens: list[int]
    max_new: int
    reserve: int
    gbnf: str | None = None
    media: tuple[MediaSpan, ...] = ()
    # On a sliding-window model, prompt positions where a window checkpoint is taken besides
    # the window's multiples, in order (where the last message starts, where its last line
    # does: prepare.py): a prompt that shares the tokens before one goes on from there.
    marks: tuple[int, ...] = ()
    # How many of its last tokens are decoded together in a decode of their own, as the
    # first answer token's row comes from that decode whether the rest was decoded just
    # before or found in the prefix cache (`prompt_tail`, planning.py).
    tail: int = 1

    @property
    def tail_start(self) -> int:
        """Where its last `tail` tokens start: the most that a prefix cache hit gives."""
        return len(self.tokens) - self.tail

    def media_at(self, position: int) -> MediaSpan | None:
        """The media item that starts at `position`, if one does."""
        return next((span for span in self.media if span.start == position), None)

    def next_mark(self, position: int) -> int | None:
        """The first of `marks` after `position`, if any."""
        return next((mark for mark in self.marks if mark > position), None)

    def text_end(self, position: int) -> int:
        """Where the run of tokens from `position` ends: the next media item's start, or the
        prompt's end."""
        return next((s.start for s in self.media if s.start >= position), len(self.tokens))

    @property
    def short_tail(self) -> int | None:
        """Where the text after the last media item starts, when it is at most SHORT_TAIL
        tokens (the question after an image): that text is decoded in one chunk, cold or
        from the prefix cache, as llama.cpp's own chunk evaluation does, rather than all but
        its last token and then that one (planning.py)."""
        if not self.media or len(self.tokens) - self.media[-1].end > SHORT_TAIL:
            return None
        return self.media[-1].end

    def reusable(self, common: int) -> int:
        """`common` prompt positions, or fewer so that no media item is cut (an item's cells
        are reused whole or not at all) and a short tail is decoded whole."""
        if (tail := self.short_tail) is not None:
            common = min(common, tail)
        for span in self.media:
            if span.start < common < span.end:
                return span.start
        return common


@dataclass(eq=False)
class Choice:
    """One answer of a job: its sequence, sampler and text state."""

    index: int
    seq_id: int
    sampler: SamplerHandle
    stops: tuple[str, ...]
    n_past: int = 0
    n_gen: int = 0
    last_token: int = -1
    done: bool = False
    generated: list[int] = field(default_factory=list)
    assembler: Utf8Assembler = field(default_factory=Utf8Assembler)
    stopper: StopMatcher = field(init=False)
    pending: Pending | None = None
    drafter: DraftPace | None = None  # made at its first draft (policy.py)

    def __post_init__(self) -> None:
        self.stopper = StopMatcher(self.stops)

    def held_tokens(self, prompt: list[int]) -> list[int]:
        """The tokens whose KV this choice's sequence holds (positions 0 … n_past-1)."""
        return (prompt + self.generated)[: self.n_past]

    def push_text(self, piece: bytes) -> tuple[str, str | None]:
        """Feed a token's bytes; (text safe to release now, the stop string found or None)."""
        return self.stopper.push(self.assembler.feed(piece))

    def drain_text(self) -> str:
        """Text still held back (an unfinished character, a partial stop string) at the end."""
        return self.stopper.push(self.assembler.flush())[0] + self.stopper.flush()


@dataclass(eq=False)
class Job:
    """A generation request: its prompt, its choices (one sequence each) and its state."""

    rid: int
    request: GenerationRequest
    prompt: Prompt
    sink: Sink
    state: JobState = JobState.QUEUED
    prefilled: int = 0
    cached: int = 0
    choices: list[Choice] = field(default_factory=list)
    admitted_at: float = 0.0  # time.perf_counter() when admitted, and when its prompt was read
    prefilled_at: float | None = None

    @property
    def tokens(self) -> list[int]:
        """The prompt's tokens."""
        return self.prompt.tokens

    @property
    def lead(self) -> Choice:
        """Choice 0: its sequence holds the prompt, copied to the others once prefilled."""
        return self.choices[0]

    @property
    def finished(self) -> bool:
        """True once every choice has ended."""
        return bool(self.choices) and all(c.done for c in self.choices)

    @property
    def steppable(self) -> bool:
        """True when the next step has something to decode for this job: a prompt chunk, or a
        choice whose next token is known (not ended, no sample in flight)."""
        if self.state is JobState.PREFILLING:
            return True
        return any(not c.done and c.pending is None for c in self.choices)


@dataclass(eq=False)
class ScoreJob:
    """A score request: its texts (tokenized before submission) and its state."""

    rid: int
    request: ScoreRequest
    texts: list[TextState]
    sink: Sink
    state: JobState = JobState.QUEUED
    current: int = 0

    def current_text(self) -> TextState | None:
        """The text being decoded (texts with nothing to score are skipped); None when done."""
        while self.current < len(self.texts):
            text = self.texts[self.current]
            if text.fed < len(text.tokens) and text.n_rows > 0:
                return text
            self.current += 1
        return None

    def result(self, piece: Callable[[int], bytes]) -> ScoreResult:
        """Reduce each text's log-probabilities as the request asked; `piece` gives a token's
        bytes, for the first token of a text that has no BOS (described, with no value)."""
        scores = []
        for text in self.texts:
            total = math.fsum(text.logprobs)
            if self.request.reduction == "sum" or not text.logprobs:
                scores.append(total)
            else:
                scores.append(total / len(text.logprobs))
        per_token = (
            tuple(tuple(t.logprobs) for t in self.texts)
            if self.request.return_token_logprobs
            else None
        )
        details = (
            tuple(_described(t, piece) for t in self.texts)
            if self.request.top_logprobs is not None
            else None
        )
        return ScoreResult(
            scores=tuple(scores),
            token_logprobs=per_token,
            n_tokens=sum(len(t.tokens) for t in self.texts),
            tokens=details,
        )


def _described(text: TextState, piece: Callable[[int], bytes]) -> tuple[TokenLogprob, ...]:
    """A scored text's token entries, led by its own first token when it has one."""
    if not (text.own_first and text.tokens):
        return tuple(text.details)
    return (TokenLogprob(0, piece(text.tokens[0]), None), *text.details)


# Texts one embeddings decode may hold (each pooled over a sequence of its own).
EMBED_MAX_SEQS = 64
# Tokens per embeddings decode, alone in the engine (a longer text is split across decodes
# when the model allows it, else decoded alone).
EMBED_CHUNK = 64


@dataclass(eq=False)
class EmbedJob:
    """An embeddings request: its texts (tokenized before submission), the vectors of the
    first `len(vectors)` of them, how many tokens of the next one are decoded (`fed`), and its
    state. With `whole_texts` a text is never split across decodes."""

    rid: int
    request: EmbedRequest
    texts: list[list[int]]
    sink: Sink
    whole_texts: bool = True
    state: JobState = JobState.QUEUED
    vectors: list[np.ndarray] = field(default_factory=list)
    fed: int = 0

    def next_spans(self, budget: int) -> list[EmbedSpan]:
        """The spans of the next decode, in text order, within `budget` tokens and
        EMBED_MAX_SEQS texts: the rest of the current text, then the texts after it. A text
        that does not fit is cut at the budget or, with `whole_texts`, taken whole when it
        comes first and else left for the next decode."""
        spans: list[EmbedSpan] = []
        index, start = len(self.vectors), self.fed
        while index < len(self.texts) and len(spans) < EMBED_MAX_SEQS and budget > 0:
            tokens = self.texts[index]
            take = len(tokens) - start
            if take > budget:
                if self.whole_texts and spans:
                    break
                if not self.whole_texts:
                    take = budget
            end = start + take
            spans.append(
                EmbedSpan(index % EMBED_MAX_SEQS, tokens[start:end], start, end == len(tokens))
            )
            budget -= take
            index, start = index + 1, 0
        return spans

    def record(self, spans: Sequence[EmbedSpan], vectors: Sequence[np.ndarray | None]) -> None:
        """Take in a decode's outcome: the vectors of the texts it ended, in order."""
        for span, vector in zip(spans, vectors, strict=True):
            if vector is None:
                self.fed = span.start + len(span.tokens)
            else:
                self.vectors.append(vector)
                self.fed = 0

    @property
    def done(self) -> bool:
        """True once every text has its vector."""
        return len(self.vectors) == len(self.texts)

    def result(self) -> EmbedResult:
        """The vectors in request order, and the tokens read."""
        return EmbedResult(tuple(self.vectors), sum(len(t) for t in self.texts))


AnyJob = Job | ScoreJob | EmbedJob
