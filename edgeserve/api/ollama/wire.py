"""Ollama's request bodies (POST /api/chat, /api/generate, /api/embed, /api/embeddings,
/api/show). Unknown fields are ignored, as Ollama ignores them; `options` is read by
`options.py`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from edgeserve.api.common.wire import ProtocolModel


class FunctionCall(ProtocolModel):
    """A call an assistant message made: the function's name and its arguments object."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(ProtocolModel):
    """One entry of a message's `tool_calls`."""

    function: FunctionCall


class Message(ProtocolModel):
    """One chat message; `images` are base64-encoded files."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None


class ToolFunction(ProtocolModel):
    """A function the model may call."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)


class Tool(ProtocolModel):
    """A tool: a function."""

    type: Literal["function"] = "function"
    function: ToolFunction


class GenerationRequest(ProtocolModel):
    """What /api/chat and /api/generate share. `stream` defaults to true, as at Ollama;
    `format` is "json" or a JSON schema; `think` is refused when true."""

    model: str | None = None
    stream: bool | None = True
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None
    think: bool | str | None = None


class ChatRequest(GenerationRequest):
    """POST /api/chat."""

    messages: list[Message] | None = None
    tools: list[Tool] | None = None


class GenerateRequest(GenerationRequest):
    """POST /api/generate: a prompt, rendered with the chat template unless `raw`."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list[str] | None = None


class EmbedRequest(ProtocolModel):
    """POST /api/embed: one text or several."""

    model: str | None = None
    input: str | list[str] = Field(default_factory=list)
    truncate: bool | None = None
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


class EmbeddingsRequest(ProtocolModel):
    """POST /api/embeddings (Ollama's older endpoint): one prompt."""

    model: str | None = None
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


class ShowRequest(ProtocolModel):
    """POST /api/show (`name` is the older spelling of `model`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None
