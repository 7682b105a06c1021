"""Pure builders of OpenAI Responses API bodies and stream events from engine results.

A non-stream answer is one `response` object (`response_body`). A stream (`ResponsesRenderer`) is
named SSE events, each with the next `sequence_number`: `response.created`,
`response.in_progress`, then per output item `response.output_item.added`, for a message
`response.content_part.added`, `response.output_text.delta`… `response.output_text.done`,
`response.content_part.done`, for a function call `response.function_call_arguments.delta`…
`response.function_call_arguments.done`, then `response.output_item.done`; last
`response.completed`, or `response.incomplete` when max_output_tokens cut the answer.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from edgeserve.api.common.generating_api import ChoiceAnswer, ChoiceEnd, TokenUsage
from edgeserve.api.common.logprobs import AlignedLogprob, LogprobAligner
from edgeserve.api.common.openai_render import (
    new_tool_call_id,
    stream_error_event,
    wire_finish_reason,
)
from edgeserve.api.common.tool_calls import ToolCall
from edgeserve.api.common.tool_stream import CallArguments, CallStart, Content, Piece
from edgeserve.api.common.wire import Finish
from edgeserve.api.openai_responses.wire import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    TextConfig,
)
from edgeserve.errors import ApiError


def new_response_id() -> str:
    """`resp_` + 32 lowercase hex digits."""
    return f"resp_{uuid.uuid4().hex}"


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _status(engine_reason: str) -> str:
    """The response status: "incomplete" when the answer was cut (max_output_tokens or the
    context), else "completed"."""
    return "incomplete" if wire_finish_reason(engine_reason) is Finish.LENGTH else "completed"


def _response(
    req: ResponsesRequest,
    id: str,
    created_at: int,
    status: str,
    output: list[OutputItem],
    usage: ResponseUsage | None = None,
) -> ResponseObject:
    """The response object, repeating the request's settings as OpenAI does."""
    return ResponseObject(
        id=id,
        created_at=created_at,
        status=status,
        model=req.model,
        output=output,
        usage=usage,
        incomplete_details=IncompleteDetails() if status == "incomplete" else None,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        tools=req.tools or [],
        tool_choice="auto" if req.tool_choice is None else req.tool_choice,
        parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        text=req.text or TextConfig(),
        metadata=req.metadata or {},
    )


def _dump(model: ResponseObject | OutputItem | OutputText) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True)


def _usage(usage: TokenUsage) -> ResponseUsage:
    return response_usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def response_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> ResponseUsage:
    """Token usage in Responses' names."""
    return ResponseUsage(
        input_tokens=prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens),
        output_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def _call_item(name: str, arguments: str, status: str) -> FunctionCallItem:
    return FunctionCallItem(
        id=_item_id("fc"), call_id=new_tool_call_id(), name=name, arguments=arguments, status=status
    )


def response_body(
    req: ResponsesRequest,
    text: str,
    calls: Sequence[ToolCall] | None,
    engine_reason: str,
    usage: ResponseUsage,
) -> bytes:
    """The non-stream answer: one function_call item per call when the answer is tool calls,
    else one assistant message holding the text."""
    status = _status(engine_reason)
    output: list[OutputItem]
    if calls:
        output = [_call_item(call.name, call.arguments, "completed") for call in calls]
    else:
        content = [OutputText(text=text)]
        output = [OutputMessage(id=_item_id("msg"), status=status, content=content)]
    body = _response(req, new_response_id(), int(time.time()), status, output, usage)
    return json.dumps(_dump(body), ensure_ascii=False).encode()


class ResponsesRenderer:
    """One Responses request's answer: the whole response object, or its events, built from
    the pieces of its answer (text, or tool calls as `tool_stream` reads them)."""

    def __init__(self, req: ResponsesRequest) -> None:
        self._req = req
        self._id = new_response_id()
        self._created_at = int(time.time())
        self._sequence = 0
        self._output: list[OutputItem] = []
        self._open = False

    def aligner(self) -> LogprobAligner:
        """Unused: the Responses API sends no log-probabilities."""
        return LogprobAligner()

    def body(self, answers: Sequence[ChoiceAnswer], usage: TokenUsage) -> bytes:
        """The response object (one choice: Responses has no n)."""
        answer = answers[0]
        return response_body(self._req, answer.text, answer.calls, answer.reason, _usage(usage))

    def start(self) -> list[bytes]:
        """`response.created` and `response.in_progress`."""
        response = _dump(_response(self._req, self._id, self._created_at, "in_progress", []))
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def pieces(
        self, index: int, pieces: Sequence[Piece], logprobs: list[AlignedLogprob] | None
    ) -> list[bytes]:
        """The events for the next pieces of the answer."""
        events: list[bytes] = []
        for piece in pieces:
            if isinstance(piece, Content):
                if not (self._open and isinstance(self._output[-1], OutputMessage)):
                    events += self._close("completed")
                    events += self._open_message()
                events.append(self._text_delta(piece.text))
            elif isinstance(piece, CallStart):
                events += self._close("completed")
                events += self._open_item(_call_item(piece.name, "", "in_progress"))
            else:
                events.append(self._arguments_delta(piece))
        return events

    def finish(self, end: ChoiceEnd, usage: TokenUsage) -> list[bytes]:
        """Close the last item (an empty message when the answer was empty), then
        `response.completed` or `response.incomplete` with the whole response."""
        status = _status(end.finished.reason)
        events = [] if self._output else self._open_message()
        events += self._close(status)
        response = _response(
            self._req, self._id, self._created_at, status, self._output, _usage(usage)
        )
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self._event(kind, response=_dump(response))]

    def end(self, usage: TokenUsage) -> list[bytes]:
        """Nothing: `response.completed` (or `.incomplete`) was the last event."""
        return []

    def failure(self, err: ApiError) -> list[bytes]:
        """An OpenAI-shaped error event (Responses streams have no `[DONE]`)."""
        return [stream_error_event(err.status, err.detail)]

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    def _open_item(self, item: OutputItem) -> list[bytes]:
        self._output.append(item)
        self._open = True
        index = len(self._output) - 1
        return [self._event("response.output_item.added", output_index=index, item=_dump(item))]

    def _open_message(self) -> list[bytes]:
        message = OutputMessage(id=_item_id("msg"), status="in_progress", content=[])
        events = self._open_item(message)
        part = OutputText(text="")
        message.content.append(part)
        events.append(self._event("response.content_part.added", **self._where(), part=_dump(part)))
        return events

    def _where(self, content: bool = True) -> dict[str, Any]:
        """The fields that locate an event in the open item (and its content part)."""
        where: dict[str, Any] = {
            "item_id": self._output[-1].id,
            "output_index": len(self._output) - 1,
        }
        if content:
            where["content_index"] = 0
        return where

    def _text_delta(self, text: str) -> bytes:
        message = self._output[-1]
        assert isinstance(message, OutputMessage)
        message.content[0].text += text
        return self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[])

    def _arguments_delta(self, piece: CallArguments) -> bytes:
        call = self._output[-1]
        assert isinstance(call, FunctionCallItem)
        call.arguments += piece.text
        return self._event(
            "response.function_call_arguments.delta", **self._where(content=False), delta=piece.text
        )

    def _close(self, status: str) -> list[bytes]:
        """The closing events of the open item, if any."""
        if not self._open:
            return []
        self._open = False
        item = self._output[-1]
        if isinstance(item, OutputMessage):
            part = item.content[0]
            events = [
                self._event(
                    "response.output_text.done", **self._where(), text=part.text, logprobs=[]
                ),
                self._event("response.content_part.done", **self._where(), part=_dump(part)),
            ]
            item.status = status
        else:
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    **self._where(content=False),
                    name=item.name,
                    arguments=item.arguments,
                )
            ]
            item.status = "completed"
        index = len(self._output) - 1
        events.append(
            self._event("response.output_item.done", output_index=index, item=_dump(item))
        )
        return events
