"""GET /v1/models' answer."""

from __future__ import annotations

from edgeserve.api.models.wire import ModelCard, ModelList


def models_body(model_id: str, created: int, modalities: list[str] | None = None) -> bytes:
    """GET /v1/models: one model card (with `modalities` when the model reads more than
    text)."""
    card = ModelCard(id=model_id, created=created, input_modalities=modalities)
    return ModelList(data=[card]).model_dump_json().encode()
