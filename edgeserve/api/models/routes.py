"""GET /v1/models."""

from __future__ import annotations

import time

from edgeserve.api.common.call import Call, Route
from edgeserve.api.common.media import input_modalities
from edgeserve.api.models.render import models_body


async def list_models(call: Call) -> bytes:
    """One model card whose id is the configured model name, and what the model reads when
    that is more than text."""
    kinds = call.engine.media_kinds
    modalities = input_modalities(kinds) if kinds else None
    return models_body(call.model_name, int(time.time()), modalities)


ROUTES = (Route("GET", "/v1/models", list_models),)
