"""Legacy text completions as bytes: the whole answer, and its stream chunks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from edgeserve.api.common.generating_api import ChoiceAnswer, ChoiceEnd, TokenUsage
from edgeserve.api.common.logprobs import AlignedLogprob, LogprobAligner
from edgeserve.api.common.openai_render import (
    TextEvent,
    build_usage,
    openai_stream_end,
    openai_stream_failure,
    sse_event,
    token_text,
    wire_finish_reason,
)
from edgeserve.api.common.tool_stream import Content, Piece
from edgeserve.api.openai_completions.wire import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
)
from edgeserve.errors import ApiError


def new_text_completion_id() -> str:
    """`cmpl-` + 32 lowercase hex digits (legacy completions)."""
    return f"cmpl-{uuid.uuid4().hex}"


def completion_logprobs(entries: Sequence[AlignedLogprob]) -> CompletionLogprobs:
    """OpenAI's legacy completion `logprobs` object for these tokens (a token with no
    log-probability, an echoed prompt's unpredicted first token, has null alternatives)."""
    return CompletionLogprobs(
        tokens=[token_text(entry.logprob.token) for entry in entries],
        token_logprobs=[entry.logprob.logprob for entry in entries],
        top_logprobs=[
            None
            if entry.logprob.logprob is None
            else {token_text(token): value for token, value in entry.logprob.top}
            for entry in entries
        ],
        text_offset=[entry.text_offset for entry in entries],
    )


def completion_body(
    id: str,
    model: str,
    choices: list[tuple[str, str]],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
    *,
    created: int | None = None,
    logprobs: Sequence[Sequence[AlignedLogprob]] | None = None,
) -> bytes:
    """A legacy text completion: `choices` are (text, engine finish reason) in index order;
    compact JSON, every field present (`logprobs` null unless `logprobs[i]` gives choice i's
    token log-probabilities). `created` defaults to now."""
    entries = list(logprobs) if logprobs is not None else [None] * len(choices)
    response = CompletionResponse(
        id=id,
        created=int(time.time()) if created is None else created,
        model=model,
        choices=[
            CompletionChoice(
                text=text,
                index=index,
                logprobs=None if aligned is None else completion_logprobs(aligned),
                finish_reason=wire_finish_reason(reason),
            )
            for index, ((text, reason), aligned) in enumerate(zip(choices, entries, strict=True))
        ],
        usage=build_usage(prompt_tokens, completion_tokens, cached_tokens),
    )
    return response.model_dump_json().encode()


def completion_chunk(
    id: str,
    model: str,
    created: int,
    index: int,
    text: str,
    finish_reason: str | None = None,
    logprobs: Sequence[AlignedLogprob] | None = None,
) -> bytes:
    """One streamed completion event: new text for choice `index`, or (with the engine's
    `finish_reason`) the choice's last event, whose text is usually empty; `logprobs`, when
    given, are the tokens whose text this event releases."""
    finish = None if finish_reason is None else wire_finish_reason(finish_reason)
    wire_logprobs = None if logprobs is None else completion_logprobs(logprobs)
    choice = CompletionChoice(text=text, index=index, logprobs=wire_logprobs, finish_reason=finish)
    chunk = CompletionResponse(id=id, created=created, model=model, choices=[choice])
    return sse_event(chunk.model_dump(mode="json", exclude={"usage"}))


def completion_usage_chunk(
    id: str,
    model: str,
    created: int,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> bytes:
    """The stream_options.include_usage event of a completion stream: no choices, just usage."""
    chunk = CompletionResponse(
        id=id,
        created=created,
        model=model,
        choices=[],
        usage=build_usage(prompt_tokens, completion_tokens, cached_tokens),
    )
    return sse_event(chunk.model_dump(mode="json"))


class CompletionsRenderer:
    """One legacy completion request's answer. Choice `i` answers prompt `i // n`; with `echo`
    it starts with `leads[i // n]` (the prompt's text) and, when scored, its log-probabilities
    with the prompt's token entries (`echoed`)."""

    def __init__(
        self,
        model: str,
        leads: list[str],
        n: int,
        *,
        echo: bool,
        generates: bool,
        include_usage: bool,
        logprobs: bool,
        echoed: list[list[AlignedLogprob]] | None,
    ) -> None:
        self._id = new_text_completion_id()
        self._model = model
        self._created = int(time.time())
        self._leads = leads
        self._n = n
        self._echo = echo
        self._generates = generates
        self._include_usage = include_usage
        self._logprobs = logprobs
        self._echoed = echoed
        self._text_events: dict[int, TextEvent] = {}

    def _lead(self, index: int) -> str:
        return self._leads[index // self._n]

    def _echo_entries(self, index: int) -> list[AlignedLogprob]:
        return [] if self._echoed is None else self._echoed[index // self._n]

    def aligner(self) -> LogprobAligner:
        """Offsets count from the end of the echoed prompt; text-less trailing tokens are
        listed at the finish, as vLLM lists them."""
        return LogprobAligner(lambda index: len(self._lead(index)), release_at_end=True)

    def body(self, answers: Sequence[ChoiceAnswer], usage: TokenUsage) -> bytes:
        """The `text_completion` object (every prompt's choices; a lead alone when nothing was
        generated)."""
        count = len(self._leads) * self._n
        whole = list(answers) or [ChoiceAnswer() for _ in range(count)]
        return completion_body(
            self._id,
            self._model,
            [(self._lead(i) + answer.text, answer.reason) for i, answer in enumerate(whole)],
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens or None,
            created=self._created,
            logprobs=(
                [self._echo_entries(i) + answer.logprobs for i, answer in enumerate(whole)]
                if self._logprobs
                else None
            ),
        )

    def start(self) -> list[bytes]:
        """With `echo`, each choice's prompt first (finished when nothing is generated)."""
        if not self._echo:
            return []
        return [
            completion_chunk(
                self._id,
                self._model,
                self._created,
                index,
                self._lead(index),
                None if self._generates else "length",
                self._echo_entries(index) if self._logprobs else None,
            )
            for index in range(len(self._leads) * self._n)
        ]

    def pieces(
        self, index: int, pieces: Sequence[Piece], logprobs: list[AlignedLogprob] | None
    ) -> list[bytes]:
        """One chunk for the text, with the entries it released."""
        if not pieces:
            return []
        text = "".join(piece.text for piece in pieces if isinstance(piece, Content))
        if logprobs is None:  # the common chunk, fast
            return [self._text_event(index)(text)]
        return [completion_chunk(self._id, self._model, self._created, index, text, None, logprobs)]

    def _text_event(self, index: int) -> TextEvent:
        """Choice `index`'s text chunk without log-probabilities (made on its first use)."""
        event = self._text_events.get(index)
        if event is None:
            event = TextEvent(
                lambda text: completion_chunk(self._id, self._model, self._created, index, text)
            )
            self._text_events[index] = event
        return event

    def finish(self, end: ChoiceEnd, usage: TokenUsage) -> list[bytes]:
        """The choice's last chunk: no text, its finish reason, the entries left."""
        return [
            completion_chunk(
                self._id,
                self._model,
                self._created,
                end.finished.index,
                "",
                end.finished.reason,
                end.logprobs,
            )
        ]

    def end(self, usage: TokenUsage) -> list[bytes]:
        """The usage chunk (with stream_options.include_usage), then `[DONE]`."""
        if not self._include_usage:
            return openai_stream_end(None)
        counts = (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens or None)
        return openai_stream_end(
            completion_usage_chunk(self._id, self._model, self._created, *counts)
        )

    def failure(self, err: ApiError) -> list[bytes]:
        """An OpenAI-shaped error event, then `[DONE]`."""
        return openai_stream_failure(err.status, err.detail)
