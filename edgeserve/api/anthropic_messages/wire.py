"""Anthropic Messages wire types (POST /v1/messages and /v1/messages/count_tokens).

Requests take text, image (base64 and url sources), tool_use and tool_result blocks; thinking
blocks of earlier turns are accepted and left out of the prompt, document blocks are refused.
Responses and stream events are Anthropic's shapes, as the `anthropic`
SDK reads them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from edgeserve.api.common.wire import ProtocolModel


class TextBlock(ProtocolModel):
    """A text block (request or response)."""

    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(ProtocolModel):
    """A call the assistant made (request or response); `input` is the arguments object."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(ProtocolModel):
    """The result of a call, in a user message: text or text blocks."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[RequestBlock] = ""
    is_error: bool = False


class ThinkingBlock(ProtocolModel):
    """An earlier turn's thinking (or redacted thinking); not part of the prompt."""

    type: Literal["thinking", "redacted_thinking"]


class Base64ImageSource(ProtocolModel):
    """An image sent as base64 data."""

    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLImageSource(ProtocolModel):
    """An image the server downloads."""

    type: Literal["url"]
    url: str


class FileImageSource(ProtocolModel):
    """An image uploaded through Anthropic's Files API; this server keeps no files (a 400)."""

    type: Literal["file"]


class ImageBlock(ProtocolModel):
    """An image, in a user message or a tool result."""

    type: Literal["image"]
    source: Annotated[
        Base64ImageSource | URLImageSource | FileImageSource, Field(discriminator="type")
    ]


class DocumentBlock(ProtocolModel):
    """A document (PDF, text); this server does not take it (a 400 naming the block)."""

    type: Literal["document"]


RequestBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | ImageBlock | DocumentBlock,
    Field(discriminator="type"),
]
ToolResultBlock.model_rebuild()


class MessageParam(ProtocolModel):
    """One request message."""

    role: Literal["user", "assistant"]
    content: str | list[RequestBlock]


class Tool(ProtocolModel):
    """A client tool: a name, a description and the JSON schema of its input."""

    type: Literal["custom"] | None = None
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(ProtocolModel):
    """How the model may use the tools: `auto`, `any` (some call), `tool` (`name`), `none`."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountTokensRequest(ProtocolModel):
    """POST /v1/messages/count_tokens body: the prompt part of a Messages request."""

    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages body."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


class MessagesUsage(ProtocolModel):
    """Token counts: `input_tokens` excludes the prompt tokens read from the prefix cache,
    which `cache_read_input_tokens` counts (Anthropic's split)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(ProtocolModel):
    """A Messages response (also the `message` of a stream's message_start)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = None
    usage: MessagesUsage


class CountTokensResponse(ProtocolModel):
    """POST /v1/messages/count_tokens answer."""

    input_tokens: int
