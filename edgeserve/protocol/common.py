"""Wire types shared by every endpoint: the base model and token usage."""

from __future__ import annotations

from typing import Any

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
