"""Wire types several APIs share: the base model, token usage, message roles, finish reasons,
stream options and multimodal content items."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class ProtocolModel(BaseModel):
    """Base of every wire model: unknown fields are ignored, as the reference does."""

    model_config = ConfigDict(extra="ignore")


class PromptTokensDetails(ProtocolModel):
    """How many prompt tokens were served from the prefix cache."""

    cached_tokens: int = 0


class Usage(ProtocolModel):
    """Token counts of one completion.

    `prompt_tokens_details` is an OpenAI extension: it is serialised only when it is not None, so a
    response without cache information keeps the reference's exact three-key body
    `{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}`.
    """

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_details(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if self.prompt_tokens_details is None:
            data.pop("prompt_tokens_details", None)
        return data


class Finish(StrEnum):
    """Why a choice ended."""

    STOP = "stop"
    LENGTH = "length"
    TOOL = "tool_calls"


class URL(ProtocolModel):
    """A media reference: http(s) URL, data URI or local path."""

    url: str
    detail: Literal["auto", "low", "high"] = "auto"


class MultimodalInputItem(ProtocolModel):
    """One part of a list-typed message content."""

    type: Literal["text", "image_url", "video_url", "audio_url"]
    text: str | None = None
    image_url: URL | None = None
    video_url: URL | None = None
    audio_url: URL | None = None


class InputAudio(ProtocolModel):
    """OpenAI's `input_audio`: a base64-encoded file and its format."""

    data: str
    format: Literal["wav", "mp3"]


class MultimodalInputItemWithAudio(MultimodalInputItem):
    """A content item where the model takes audio: the reference's four types and OpenAI's
    `input_audio` (README divergence 19; the reference's schema refuses it with a 422)."""

    type: Literal["text", "image_url", "video_url", "audio_url", "input_audio"]
    input_audio: InputAudio | None = None


class StreamOptions(ProtocolModel):
    """OpenAI `stream_options`."""

    include_usage: bool = False


class Role(StrEnum):
    """Message roles; the member order gives the reference's 422 enum message."""

    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    FUNCTION = "function"
    TOOL = "tool"
