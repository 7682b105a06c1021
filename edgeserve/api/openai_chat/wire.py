"""Chat completion wire types: LlamaFactory's schema, then the OpenAI extensions.

Field order is part of the contract: pydantic reports 422 errors in declaration order, so the
reference fields come first, exactly as the reference declares them, and every extension field
comes after them. The union members' type names (`str`, `list[MultimodalInputItem]`, `list[str]`)
appear in 422 `loc`s, so the class names below must not change.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from edgeserve.api.common.wire import (
    Finish,
    MultimodalInputItem,
    MultimodalInputItemWithAudio,
    ProtocolModel,
    Role,
    StreamOptions,
    Usage,
)


class Function(ProtocolModel):
    """A function call the assistant made; `arguments` is a JSON string."""

    name: str
    arguments: str


class FunctionDefinition(ProtocolModel):
    """A callable tool. `name` and `parameters` are required, as in the reference; the
    reference also requires `description`, which is optional here, as at OpenAI (README
    divergence 11). An absent description stays absent from the tools shown to the model."""

    name: str
    description: str = ""
    parameters: dict[str, Any]


class FunctionAvailable(ProtocolModel):
    """One entry of `tools`."""

    type: Literal["function", "code_interpreter"] = "function"
    function: FunctionDefinition | None = None


class FunctionCall(ProtocolModel):
    """One entry of an assistant message's `tool_calls`."""

    id: str
    type: Literal["function"] = "function"
    function: Function


class ChatMessage(ProtocolModel):
    """One request message."""

    role: Role
    content: str | list[MultimodalInputItem] | None = None
    tool_calls: list[FunctionCall] | None = None


class ResponseFormat(ProtocolModel):
    """OpenAI `response_format`; `json_schema` carries the schema object for type json_schema."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(ProtocolModel):
    """POST /v1/chat/completions body."""

    model: str
    messages: list[ChatMessage]
    tools: list[FunctionAvailable] | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    presence_penalty: float | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    max_completion_tokens: int | None = None
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tool_choice: Any | None = None
    user: str | None = None


class ChatMessageWithAudio(ChatMessage):
    """A request message where the model takes audio (its items may be `input_audio`)."""

    content: str | list[MultimodalInputItemWithAudio] | None = None


class ChatCompletionRequestWithAudio(ChatCompletionRequest):
    """The chat body where the model takes audio: the same fields in the same order, the
    messages' items also `input_audio`."""

    messages: list[ChatMessageWithAudio]


class ChatCompletionMessage(ProtocolModel):
    """A response message."""

    role: Role | None = None
    content: str | None = None
    tool_calls: list[FunctionCall] | None = None


class FunctionDelta(ProtocolModel):
    """A streamed call's function: the name on its first chunk, then pieces of `arguments`."""

    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(ProtocolModel):
    """One entry of a stream delta's `tool_calls` (OpenAI's shape): the call's `index`; its
    `id` and `type` only on the call's first chunk."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class ChatCompletionDelta(ProtocolModel):
    """A stream chunk's delta (dumped with only the fields that were set)."""

    role: Role | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class TopLogprob(ProtocolModel):
    """One of the most likely tokens at a position; `bytes` is its UTF-8 encoding."""

    token: str
    logprob: float
    bytes: list[int] | None


class ChatCompletionTokenLogprob(ProtocolModel):
    """One generated token, its log-probability and the most likely alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(ProtocolModel):
    """A choice's `logprobs`: one entry per content token (`refusal` is always null)."""

    content: list[ChatCompletionTokenLogprob] | None
    refusal: None = None


class ChatCompletionResponseChoice(ProtocolModel):
    """One non-stream choice; `logprobs` is serialised only when it was requested, so other
    responses keep the reference's three keys."""

    index: int
    message: ChatCompletionMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Finish

    @model_serializer(mode="wrap")
    def _omit_absent_logprobs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if self.logprobs is None:
            data.pop("logprobs", None)
        return data


class ChatCompletionStreamResponseChoice(ProtocolModel):
    """One stream choice (chunks are dumped with only the fields that were set)."""

    index: int
    delta: ChatCompletionDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Finish | None = None


class ChatCompletionResponse(ProtocolModel):
    """Non-stream response body."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: Usage


class ChatCompletionStreamResponse(ProtocolModel):
    """One SSE chunk; `usage` is set only on the include_usage chunk."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionStreamResponseChoice]
    usage: Usage | None = None
