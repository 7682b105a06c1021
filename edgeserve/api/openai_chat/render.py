"""Chat completions as bytes: the whole answer, and its stream chunks.

Divergence 4: stream chunks also carry `object` and `created`, and the final chunk's
finish_reason is the true one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from edgeserve.api.common.generating_api import ChoiceAnswer, ChoiceEnd, TokenUsage
from edgeserve.api.common.logprobs import AlignedLogprob, LogprobAligner
from edgeserve.api.common.openai_render import (
    TextEvent,
    build_usage,
    new_tool_call_id,
    openai_stream_end,
    openai_stream_failure,
    sse_event,
    token_text,
    wire_finish_reason,
)
from edgeserve.api.common.tool_calls import ToolCall
from edgeserve.api.common.tool_stream import CallStart, Content, Piece
from edgeserve.api.common.wire import Finish, Role, Usage
from edgeserve.api.openai_chat.wire import (
    ChatCompletionDelta,
    ChatCompletionMessage,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamResponse,
    ChatCompletionStreamResponseChoice,
    ChatCompletionTokenLogprob,
    ChoiceLogprobs,
    Function,
    FunctionCall,
    FunctionDelta,
    ToolCallDelta,
    TopLogprob,
)
from edgeserve.errors import ApiError


def new_completion_id() -> str:
    """`chatcmpl-` + 32 lowercase hex digits."""
    return f"chatcmpl-{uuid.uuid4().hex}"


def chat_completion_body(
    id: str,
    model: str,
    choices: list[tuple[str, str]],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None,
    *,
    created: int | None = None,
    tool_calls: Sequence[Sequence[ToolCall] | None] | None = None,
    logprobs: Sequence[Sequence[AlignedLogprob]] | None = None,
) -> bytes:
    """The non-stream response: `choices` are (text, engine finish reason) in index order.

    `created` defaults to now. `tool_calls[i]`, when given and non-empty, makes choice i a tool
    call answer (reference section 6): content null, the calls with fresh `call_<32 hex>` ids,
    and finish_reason "tool_calls" whatever the engine's reason was. `logprobs[i]`, when given,
    are choice i's token log-probabilities (the choice then has a `logprobs` key).
    """
    calls = list(tool_calls) if tool_calls is not None else [None] * len(choices)
    entries = list(logprobs) if logprobs is not None else [None] * len(choices)
    response = ChatCompletionResponse(
        id=id,
        created=int(time.time()) if created is None else created,
        model=model,
        choices=[
            _chat_choice(index, text, reason, found, aligned)
            for index, ((text, reason), found, aligned) in enumerate(
                zip(choices, calls, entries, strict=True)
            )
        ],
        usage=build_usage(prompt_tokens, completion_tokens, cached_tokens),
    )
    return response.model_dump_json().encode()


def _chat_choice(
    index: int,
    text: str,
    reason: str,
    calls: Sequence[ToolCall] | None,
    logprobs: Sequence[AlignedLogprob] | None,
) -> ChatCompletionResponseChoice:
    wire_logprobs = None if logprobs is None else chat_logprobs(logprobs)
    if not calls:
        message = ChatCompletionMessage(role=Role.ASSISTANT, content=text)
        return ChatCompletionResponseChoice(
            index=index,
            message=message,
            logprobs=wire_logprobs,
            finish_reason=wire_finish_reason(reason),
        )
    wire_calls = [
        FunctionCall(
            id=new_tool_call_id(), function=Function(name=call.name, arguments=call.arguments)
        )
        for call in calls
    ]
    message = ChatCompletionMessage(role=Role.ASSISTANT, content=None, tool_calls=wire_calls)
    return ChatCompletionResponseChoice(
        index=index, message=message, logprobs=wire_logprobs, finish_reason=Finish.TOOL
    )


def chat_logprobs(entries: Sequence[AlignedLogprob]) -> ChoiceLogprobs:
    """OpenAI's chat `logprobs` object for these tokens (`refusal` null)."""
    return ChoiceLogprobs(
        content=[
            ChatCompletionTokenLogprob(
                token=token_text(entry.logprob.token),
                logprob=entry.logprob.logprob,
                bytes=list(entry.logprob.token),
                top_logprobs=[
                    TopLogprob(token=token_text(token), logprob=value, bytes=list(token))
                    for token, value in entry.logprob.top
                ],
            )
            for entry in entries
        ],
        refusal=None,
    )


def _chunk(
    id: str,
    model: str,
    created: int,
    choices: list[ChatCompletionStreamResponseChoice],
    usage: Usage | None = None,
) -> bytes:
    chunk = ChatCompletionStreamResponse(
        id=id,
        object="chat.completion.chunk",
        created=created,
        model=model,
        choices=choices,
        usage=usage,
    )
    exclude = None if usage is not None else {"usage"}
    return sse_event(chunk.model_dump(mode="json", exclude_unset=True, exclude=exclude))


def role_chunk(id: str, model: str, created: int) -> bytes:
    """The first event: role assistant with empty content."""
    return _delta_chunk(id, model, created, ChatCompletionDelta(role=Role.ASSISTANT, content=""))


def piece_chunks(
    id: str,
    model: str,
    created: int,
    pieces: Sequence[Piece],
    logprobs: Sequence[AlignedLogprob] | None = None,
) -> list[bytes]:
    """One event per piece of a streamed answer: text or, with tool calls (README divergence
    10), a call's start (OpenAI's first chunk of a call: `index`, a fresh `id`, `type`, the
    name and empty `arguments`) or the next piece of its arguments (`index` and `arguments`).
    `logprobs`, when given, are the tokens consumed since the last event; they go with the
    first one."""
    chunks = []
    for piece in pieces:
        if isinstance(piece, Content):
            delta = ChatCompletionDelta(content=piece.text)
        elif isinstance(piece, CallStart):
            function = FunctionDelta(name=piece.name, arguments="")
            call = ToolCallDelta(
                index=piece.index, id=new_tool_call_id(), type="function", function=function
            )
            delta = ChatCompletionDelta(tool_calls=[call])
        else:
            call = ToolCallDelta(index=piece.index, function=FunctionDelta(arguments=piece.text))
            delta = ChatCompletionDelta(tool_calls=[call])
        chunks.append(_delta_chunk(id, model, created, delta, None if chunks else logprobs))
    return chunks


def finish_chunk(
    id: str,
    model: str,
    created: int,
    finish_reason: Finish,
    logprobs: Sequence[AlignedLogprob] | None = None,
) -> bytes:
    """The last event of a choice: empty delta and the true finish reason (divergence 4);
    `logprobs`, when given, are the tokens no earlier event carried."""
    return _delta_chunk(id, model, created, ChatCompletionDelta(), logprobs, finish_reason)


def _delta_chunk(
    id: str,
    model: str,
    created: int,
    delta: ChatCompletionDelta,
    logprobs: Sequence[AlignedLogprob] | None = None,
    finish_reason: Finish | None = None,
) -> bytes:
    choice = ChatCompletionStreamResponseChoice(index=0, delta=delta, finish_reason=finish_reason)
    if logprobs is not None:
        choice.logprobs = chat_logprobs(logprobs)
    return _chunk(id, model, created, [choice])


def usage_chunk(
    id: str,
    model: str,
    created: int,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> bytes:
    """The stream_options.include_usage event: no choices, just usage."""
    return _chunk(
        id, model, created, [], build_usage(prompt_tokens, completion_tokens, cached_tokens)
    )


class ChatRenderer:
    """One chat request's answer: the whole `chat.completion`, or its chunks (a role chunk,
    content or tool-call deltas, a finish chunk, the usage chunk when asked, `[DONE]`)."""

    def __init__(self, model: str, *, include_usage: bool, logprobs: bool) -> None:
        self._id = new_completion_id()
        self._model = model
        self._created = int(time.time())
        self._include_usage = include_usage
        self._logprobs = logprobs
        self._content = TextEvent(
            lambda text: _delta_chunk(
                self._id, self._model, self._created, ChatCompletionDelta(content=text)
            )
        )

    def aligner(self) -> LogprobAligner:
        """Entries of text-less trailing tokens are dropped, as OpenAI drops them."""
        return LogprobAligner()

    def body(self, answers: Sequence[ChoiceAnswer], usage: TokenUsage) -> bytes:
        """The `chat.completion` object."""
        return chat_completion_body(
            self._id,
            self._model,
            [(answer.text, answer.reason) for answer in answers],
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens or None,
            created=self._created,
            tool_calls=[answer.calls for answer in answers],
            logprobs=[answer.logprobs for answer in answers] if self._logprobs else None,
        )

    def start(self) -> list[bytes]:
        """The role chunk."""
        return [role_chunk(self._id, self._model, self._created)]

    def pieces(
        self, index: int, pieces: Sequence[Piece], logprobs: list[AlignedLogprob] | None
    ) -> list[bytes]:
        """A chunk per piece; the log-probabilities ride on the first."""
        if logprobs is None and all(type(piece) is Content for piece in pieces):
            return [self._content(piece.text) for piece in pieces]  # the common chunk, fast
        return piece_chunks(self._id, self._model, self._created, pieces, logprobs)

    def finish(self, end: ChoiceEnd, usage: TokenUsage) -> list[bytes]:
        """The finish chunk, with the entries no earlier chunk carried."""
        reason = Finish.TOOL if end.called else wire_finish_reason(end.finished.reason)
        return [finish_chunk(self._id, self._model, self._created, reason, end.logprobs or None)]

    def end(self, usage: TokenUsage) -> list[bytes]:
        """The usage chunk (with stream_options.include_usage), then `[DONE]`."""
        if not self._include_usage:
            return openai_stream_end(None)
        counts = (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens or None)
        return openai_stream_end(usage_chunk(self._id, self._model, self._created, *counts))

    def failure(self, err: ApiError) -> list[bytes]:
        """An OpenAI-shaped error event, then `[DONE]`."""
        return openai_stream_failure(err.status, err.detail)
