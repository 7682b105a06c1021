"""Which LoRA adapters a request runs under, read the same way for every API that runs the
model (chat, completions, Responses, Messages, scoring, embeddings):

- `model` naming a loaded adapter selects it at scale 1 (vLLM's convention); any other `model`
  string is the base model, as the reference serves its one model whatever `model` says;
- llama-server's `lora: [{"id": <adapter id>, "scale": <number>}]` mixes and scales adapters
  (after `model`'s: an id named in both takes the `lora` scale).

Read after an API's own checks, so that a request the reference refuses gets the reference's
error first.
"""

from __future__ import annotations

import math
from typing import Any

from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import bad
from edgeserve.engine.adapters import AdapterCatalog, adapter_set
from edgeserve.engine.types import AdapterSet
from edgeserve.errors import ApiError


def chosen_adapters(body: Any, catalog: AdapterCatalog) -> AdapterSet:
    """The adapter set `body` asks for (see the module docstring): 400 for a malformed
    `lora`, 404 for an adapter id that is not loaded."""
    if not isinstance(body, dict):
        return ()
    pairs: list[tuple[int, float]] = []
    model = body.get("model")
    if isinstance(model, str) and (named := catalog.named(model)) is not None:
        pairs.append((named.id, 1.0))
    lora = body.get("lora")
    if lora is not None:
        pairs += _lora_field(lora, catalog)
    return adapter_set(pairs)


def _lora_field(lora: Any, catalog: AdapterCatalog) -> list[tuple[int, float]]:
    """llama-server's `lora` entries as (id, scale) pairs."""
    if not isinstance(lora, list):
        raise bad(Detail.LORA_FIELD)
    pairs = []
    for index, entry in enumerate(lora):
        if not isinstance(entry, dict) or set(entry) - {"id", "scale"}:
            raise bad(Detail.LORA_FIELD)
        adapter_id, scale = entry.get("id"), entry.get("scale", 1.0)
        if not _is_int(adapter_id) or not _is_number(scale):
            raise bad(Detail.LORA_FIELD)
        if catalog.with_id(adapter_id) is None:
            raise ApiError(404, Detail.ADAPTER_ID_UNKNOWN.format(index=index, id=adapter_id))
        pairs.append((adapter_id, float(scale)))
    return pairs


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)
