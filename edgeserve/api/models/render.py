"""GET /v1/models' answer."""

from __future__ import annotations

from edgeserve.api.models.wire import ModelCard, ModelList


def models_body(model_id: str, created: int) -> bytes:
    """GET /v1/models: one model card."""
    return ModelList(data=[ModelCard(id=model_id, created=created)]).model_dump_json().encode()
