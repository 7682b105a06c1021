"""GET /v1/models wire types."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from edgeserve.api.common.wire import ProtocolModel


class ModelCard(ProtocolModel):
    """The one served model."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: Literal["owner"] = "owner"


class ModelList(ProtocolModel):
    """The model list (always exactly one card)."""

    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)
