"""GET /v1/models wire types."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from edgeserve.api.common.wire import ProtocolModel


class ModelCard(ProtocolModel):
    """The one served model. `input_modalities` (an extension after the reference's fields)
    says what a model with a projector (--mmproj) reads: "text", "image", "audio"; a text-only
    model's card leaves it out, so its body is the reference's byte for byte."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: Literal["owner"] = "owner"
    input_modalities: list[str] | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_modalities(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if self.input_modalities is None:
            data.pop("input_modalities", None)
        return data


class ModelList(ProtocolModel):
    """The model list (always exactly one card)."""

    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)
