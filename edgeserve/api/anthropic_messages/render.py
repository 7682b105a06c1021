"""Pure builders from engine results to Anthropic Messages wire bytes: the response body, the
stream's events (`MessagesRenderer`), count_tokens and errors in Anthropic's shape."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from edgeserve.api.anthropic_messages.translate import anthropic_error
from edgeserve.api.anthropic_messages.wire import (
    CountTokensResponse,
    Message,
    MessagesUsage,
    TextBlock,
    ToolUseBlock,
)
from edgeserve.api.common.generating_api import ChoiceAnswer, ChoiceEnd, TokenUsage
from edgeserve.api.common.logprobs import AlignedLogprob, LogprobAligner
from edgeserve.api.common.tool_calls import ToolCall
from edgeserve.api.common.tool_stream import CallStart, Content, Piece
from edgeserve.api.reference.errors import error_message
from edgeserve.engine.types import Finished
from edgeserve.errors import ApiError


def new_message_id() -> str:
    """`msg_` + 32 lowercase hex digits."""
    return f"msg_{uuid.uuid4().hex}"


def new_tool_use_id() -> str:
    """`toolu_` + 32 lowercase hex digits, fresh for every call."""
    return f"toolu_{uuid.uuid4().hex}"


def stop_reason(finished: Finished, called: bool) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for an answer that ended as `finished`:
    tool_use when it called a tool, stop_sequence when a stop string ended it, end_turn at the
    model's own end, max_tokens otherwise (the budget or the context ran out)."""
    if called:
        return "tool_use", None
    if finished.reason != "stop":
        return "max_tokens", None
    if finished.stop_sequence is not None:
        return "stop_sequence", finished.stop_sequence
    return "end_turn", None


def wire_usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> MessagesUsage:
    """Anthropic's usage: prompt tokens served from the prefix cache are cache reads, the
    rest input tokens."""
    return MessagesUsage(
        input_tokens=prompt_tokens - cached_tokens,
        output_tokens=output_tokens,
        cache_read_input_tokens=cached_tokens,
    )


def message_body(
    id: str,
    model: str,
    text: str,
    calls: Sequence[ToolCall] | None,
    finished: Finished,
    prompt_tokens: int,
) -> bytes:
    """The non-stream answer: its text as one text block (none when empty), or, when the answer
    is tool calls, one tool_use block per call. Anthropic's `input` is an object, so calls
    whose arguments are not one (the LlamaFactory format takes any JSON value) stay text."""
    inputs = [json.loads(call.arguments) for call in calls or ()]
    called = bool(inputs) and all(isinstance(value, dict) for value in inputs)
    content: list[TextBlock | ToolUseBlock]
    if called and calls:
        content = [
            ToolUseBlock(id=new_tool_use_id(), name=call.name, input=value)
            for call, value in zip(calls, inputs, strict=True)
        ]
    else:
        content = [TextBlock(text=text)] if text else []
    reason, sequence = stop_reason(finished, called)
    message = Message(
        id=id,
        model=model,
        content=content,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=wire_usage(prompt_tokens, finished.completion_tokens, finished.cached_tokens),
    )
    return message.model_dump_json().encode()


def count_tokens_body(input_tokens: int) -> bytes:
    """POST /v1/messages/count_tokens: the prompt's token count."""
    return CountTokensResponse(input_tokens=input_tokens).model_dump_json().encode()


def error_payload(kind: str, message: str) -> dict[str, Any]:
    """Anthropic's error object."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(kind: str, message: str) -> bytes:
    """An Anthropic error response body, compact JSON with raw UTF-8 (unpaired surrogates
    escaped)."""
    content = error_payload(kind, message)
    text = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(content, separators=(",", ":")).encode()


def event(payload: dict[str, Any]) -> bytes:
    """One SSE event named by its payload's `type`, as Anthropic streams them."""
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


class MessagesRenderer:
    """One Messages request's answer: the whole message, or its events from the pieces
    `ToolCallStream` releases (or plain text): message_start and a ping, then per content block
    content_block_start, its deltas (text_delta or input_json_delta) and content_block_stop,
    then message_delta and message_stop."""

    def __init__(self, model: str, prompt_tokens: int) -> None:
        self._id = new_message_id()
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._index = -1
        self._open: str | None = None  # the open block's type

    def aligner(self) -> LogprobAligner:
        """Unused: the Messages API sends no log-probabilities."""
        return LogprobAligner()

    def body(self, answers: Sequence[ChoiceAnswer], usage: TokenUsage) -> bytes:
        """The message object (one choice: Messages has no n)."""
        answer = answers[0]
        assert answer.finished is not None, "every generation ends with Finished"
        return message_body(
            self._id, self._model, answer.text, answer.calls, answer.finished, self._prompt_tokens
        )

    def start(self) -> list[bytes]:
        """message_start (the message with no content yet) and a ping, as Anthropic starts."""
        message = Message(
            id=self._id,
            model=self._model,
            content=[],
            stop_reason=None,
            usage=MessagesUsage(input_tokens=self._prompt_tokens, output_tokens=0),
        )
        start = event({"type": "message_start", "message": message.model_dump(mode="json")})
        return [start, event({"type": "ping"})]

    def pieces(
        self, index: int, pieces: Sequence[Piece], logprobs: list[AlignedLogprob] | None
    ) -> list[bytes]:
        """The events for these pieces of the answer."""
        events: list[bytes] = []
        for piece in pieces:
            if isinstance(piece, Content):
                if not piece.text:
                    continue
                if self._open != "text":
                    events += self._begin(TextBlock(text=""))
                delta = {"type": "text_delta", "text": piece.text}
            elif isinstance(piece, CallStart):
                events += self._begin(ToolUseBlock(id=new_tool_use_id(), name=piece.name, input={}))
                continue
            else:
                delta = {"type": "input_json_delta", "partial_json": piece.text}
            events.append(
                event({"type": "content_block_delta", "index": self._index, "delta": delta})
            )
        return events

    def finish(self, end: ChoiceEnd, usage: TokenUsage) -> list[bytes]:
        """Close the open block; message_delta (stop_reason, usage) and message_stop."""
        events = self._end()
        finished = end.finished
        reason, sequence = stop_reason(finished, end.called)
        counts = wire_usage(self._prompt_tokens, finished.completion_tokens, finished.cached_tokens)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        payload = {"type": "message_delta", "delta": delta, "usage": counts.model_dump()}
        return [*events, event(payload), event({"type": "message_stop"})]

    def end(self, usage: TokenUsage) -> list[bytes]:
        """Nothing: message_stop was the last event."""
        return []

    def failure(self, err: ApiError) -> list[bytes]:
        """Anthropic's `error` event."""
        _, kind = anthropic_error(err)
        return [event(error_payload(kind, error_message(err.detail)))]

    def _begin(self, block: TextBlock | ToolUseBlock) -> list[bytes]:
        events = self._end()
        self._index += 1
        self._open = block.type
        payload = {
            "type": "content_block_start",
            "index": self._index,
            "content_block": block.model_dump(mode="json"),
        }
        return [*events, event(payload)]

    def _end(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [event({"type": "content_block_stop", "index": self._index})]
