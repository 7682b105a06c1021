"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's shapes): off unless the
server runs with --allow-runtime-lora, and behind the API key like every endpoint (which the
server has on any address but loopback: config/sources.py). The engine loads and unloads
between steps; unloading an adapter that a live request runs under is refused with 409, never
pulled from under it. Loading follows the engine's rules (engine/adapters.py: the LoRA folder,
one name per file, --max-loras), and no adapter takes a name a client selects the model by.
Each answers the adapter's /v1/models card."""

from __future__ import annotations

import time

from edgeserve.api.common.call import Call, Route
from edgeserve.api.lora_adapters.wire import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from edgeserve.api.models.wire import ModelCard
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import bad
from edgeserve.api.reference.request import parse_body
from edgeserve.engine.adapters import Adapter
from edgeserve.errors import ApiError


async def load_lora_adapter(call: Call) -> bytes:
    """Load a LoRA GGUF of the LoRA folder as `lora_name`: 400 for a name with spaces or the
    served model's, a path outside the folder, a file that is no adapter of the model, a name
    taken; 409 for a file already loaded, or --max-loras adapters loaded."""
    _check_allowed(call)
    req = parse_body(LoadLoraAdapterRequest, call.body)
    if any(c.isspace() for c in req.lora_name):
        raise bad(Detail.LORA_NAME)
    if req.lora_name == call.model_name:
        raise bad(Detail.LORA_NAME_SERVED.format(name=req.lora_name))
    async with call.engine_work():
        adapter = await call.engine.load_adapter(req.lora_name, req.lora_path)
    return _card(call, adapter)


async def unload_lora_adapter(call: Call) -> bytes:
    """Unload the adapter `lora_name` (404 when none is loaded by that name, 409 while a live
    request runs under it)."""
    _check_allowed(call)
    req = parse_body(UnloadLoraAdapterRequest, call.body)
    async with call.engine_work():
        adapter = await call.engine.unload_adapter(req.lora_name)
    return _card(call, adapter)


def _check_allowed(call: Call) -> None:
    if not call.allow_runtime_lora:
        raise ApiError(403, Detail.RUNTIME_LORA_OFF)


def _card(call: Call, adapter: Adapter) -> bytes:
    card = ModelCard(
        id=adapter.name, created=int(time.time()), parent=call.model_name, lora_id=adapter.id
    )
    return card.model_dump_json().encode()


ROUTES = (
    Route("POST", "/v1/load_lora_adapter", load_lora_adapter),
    Route("POST", "/v1/unload_lora_adapter", unload_lora_adapter),
)
