"""GET /v1/models' answer."""

from __future__ import annotations

from collections.abc import Sequence

from edgeserve.api.common.media import input_modalities
from edgeserve.api.models.wire import (
    CatalogueCard,
    CatalogueList,
    ModelCard,
    ModelList,
    ModelMemory,
    ModelStatus,
)
from edgeserve.catalogue.status import ModelState, Status
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


def catalogue_body(models: Sequence[ModelState], created: int) -> bytes:
    """GET /models (and GET /v1/models with a catalogue): one card per model."""
    cards = []
    for state in models:
        failed = state.status is Status.FAILED
        kinds = state.media_kinds
        cards.append(
            CatalogueCard(
                id=state.id,
                created=created,
                aliases=list(state.aliases),
                status=ModelStatus(
                    value=state.status.value,
                    failed=True if failed else None,
                    reason=state.failure,
                ),
                memory=ModelMemory(estimated=state.estimated, measured=state.measured),
                expires_at=state.expires_at,
                pinned=state.pinned,
                input_modalities=input_modalities(kinds) if kinds else None,
            )
        )
    return CatalogueList(data=cards).model_dump_json().encode()
