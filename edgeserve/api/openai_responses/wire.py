"""OpenAI Responses API wire types (POST /v1/responses), the stateless subset edgeserve serves.

Request models are loose (unknown fields ignored, item `type`s checked by translate.py,
which names what is not supported); response models follow the `openai` SDK's `Response` type.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from edgeserve.api.common.wire import ProtocolModel


class InputContent(ProtocolModel):
    """One part of an input message's or a function output's content list: text, or an
    `input_image` (`image_url` a data URL or an http(s) URL; `file_id` is refused)."""

    type: str
    text: str | None = None
    image_url: str | None = None
    file_id: str | None = None


class InputItem(ProtocolModel):
    """One `input` item: a message (`type` "message" or absent), a `function_call` the model
    made earlier, or the `function_call_output` that answers it."""

    type: str = "message"
    role: str | None = None
    content: str | list[InputContent] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputContent] | None = None


class ResponsesTool(ProtocolModel):
    """One `tools` entry, Responses' flat shape (`name` beside `type`)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(ProtocolModel):
    """`text.format`: plain text, any JSON object, or JSON following `schema`."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(ProtocolModel):
    """`text`: the answer's format."""

    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(ProtocolModel):
    """POST /v1/responses body."""

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Any | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None


class OutputText(ProtocolModel):
    """An assistant message's text part."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


Status = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(ProtocolModel):
    """An output item holding the assistant's text."""

    type: Literal["message"] = "message"
    id: str
    status: Status
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(ProtocolModel):
    """An output item holding one function call; `arguments` is a JSON string."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status


OutputItem = OutputMessage | FunctionCallItem


class InputTokensDetails(ProtocolModel):
    """How many input tokens came from the prefix cache."""

    cached_tokens: int = 0


class OutputTokensDetails(ProtocolModel):
    """Reasoning tokens (always 0: nothing is generated besides the answer)."""

    reasoning_tokens: int = 0


class ResponseUsage(ProtocolModel):
    """Token counts of one response."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(ProtocolModel):
    """Why a response stopped early."""

    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseObject(ProtocolModel):
    """A response, as the body of a non-stream answer and inside the stream's lifecycle events."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ResponsesTool] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig = Field(default_factory=TextConfig)
    store: bool = False
    background: bool = False
    previous_response_id: None = None
    metadata: dict[str, str] = Field(default_factory=dict)
