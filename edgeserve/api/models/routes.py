"""GET /v1/models."""

from __future__ import annotations

import time

from edgeserve.api.common.call import Call, Route
from edgeserve.api.common.media import input_modalities
from edgeserve.api.models.render import models_body
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.errors import EngineLoading


async def list_models(call: Call) -> bytes:
    """One model card whose id is the configured model name, and what the model reads when
    that is more than text, then one per LoRA adapter; while the model loads, the 503 every
    other endpoint gives then (clients of the reference poll this endpoint to know the server
    is up)."""
    if not call.engine.loaded:
        raise engine_error(EngineLoading("the model is not loaded yet"))
    kinds = call.engine.media_kinds
    modalities = input_modalities(kinds) if kinds else None
    adapters = call.engine.adapters.listed()
    return models_body(call.model_name, int(time.time()), modalities, adapters)


ROUTES = (Route("GET", "/v1/models", list_models),)
