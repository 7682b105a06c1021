"""GET /v1/models' answer."""

from __future__ import annotations

from collections.abc import Sequence

from edgeserve.api.models.wire import ModelCard, ModelList
from edgeserve.engine.adapters import Adapter


def models_body(
    model_id: str,
    created: int,
    modalities: list[str] | None = None,
    adapters: Sequence[Adapter] = (),
) -> bytes:
    """GET /v1/models: the model's card (with `modalities` when it reads more than text),
    then one card per LoRA adapter, whose parent is the model."""
    card = ModelCard(id=model_id, created=created, input_modalities=modalities)
    cards = [card] + [
        ModelCard(
            id=a.name, created=created, input_modalities=modalities, parent=model_id, lora_id=a.id
        )
        for a in adapters
    ]
    return ModelList(data=cards).model_dump_json().encode()
