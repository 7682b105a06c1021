"""GET /v1/models wire types."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from edgeserve.api.common.wire import ProtocolModel


class ModelCard(ProtocolModel):
    """The served model, or a LoRA adapter over it. Extensions after the reference's fields,
    each left out when absent, so a text-only model without adapters answers the reference's
    body byte for byte: `input_modalities` says what a model with a projector (--mmproj)
    reads ("text", "image", "audio"); an adapter's card has the base model as its `parent`
    (vLLM's field) and its `lora_id` (the id llama-server's `lora` field names)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: Literal["owner"] = "owner"
    input_modalities: list[str] | None = None
    parent: str | None = None
    lora_id: int | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_extensions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for name in ("input_modalities", "parent", "lora_id"):
            if getattr(self, name) is None:
                data.pop(name, None)
        return data


class ModelList(ProtocolModel):
    """The model list: the served model's card, then one per LoRA adapter."""

    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)
