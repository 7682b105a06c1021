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


class ModelStatus(ProtocolModel):
    """Where a catalogue model stands, in llama-server's router shape: `value` is loaded,
    loading, unloaded or failed; a failed one says why, and so does an unloaded one whose
    last load was refused (no room), until a load starts."""

    value: Literal["loaded", "loading", "unloaded", "failed"]
    failed: bool | None = None
    reason: str | None = None

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for name in ("failed", "reason"):
            if getattr(self, name) is None:
                data.pop(name, None)
        return data


class ModelMemory(ProtocolModel):
    """A catalogue model's memory in bytes: estimated from its GGUF before loading, and what
    the process grew by when it loaded (None while not loaded)."""

    estimated: int | None
    measured: int | None


class CatalogueCard(ProtocolModel):
    """One catalogue model (GET /models, and GET /v1/models with several models): OpenAI's
    card fields, then llama-server's router fields (`aliases`, `status`), its memory and when
    it will unload (Unix seconds; None: not loaded, busy, or kept)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: Literal["owner"] = "owner"
    aliases: list[str] = Field(default_factory=list)
    status: ModelStatus
    memory: ModelMemory
    expires_at: float | None = None
    pinned: bool = False
    input_modalities: list[str] | None = None


class CatalogueList(ProtocolModel):
    """Every catalogue model."""

    object: Literal["list"] = "list"
    data: list[CatalogueCard] = Field(default_factory=list)
