"""GET /v1/models, and the catalogue's routes in llama-server's router shape: GET /models,
POST /models/load and POST /models/unload."""

from __future__ import annotations

import time

from edgeserve.api.common.call import Call, Route
from edgeserve.api.common.media import input_modalities
from edgeserve.api.models.render import catalogue_body, models_body
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.api.reference.limits import bad
from edgeserve.catalogue.status import Models
from edgeserve.errors import EngineError, EngineLoading

SUCCESS = b'{"success":true}'


async def list_models(call: Call) -> bytes:
    """With --model alone: one model card whose id is the configured model name, and what
    the model reads when that is more than text, then one per LoRA adapter; while the model
    loads, the 503 every other endpoint gives then (clients of the reference poll this
    endpoint to know the server is up). With a catalogue: every model (`catalogue_models`)."""
    fleet = _fleet(call)
    if not fleet.single:
        return catalogue_body(fleet.states(), int(time.time()))
    if not call.engine.loaded:
        raise engine_error(EngineLoading("the model is not loaded yet"))
    kinds = call.engine.media_kinds
    modalities = input_modalities(kinds) if kinds else None
    adapters = call.engine.adapters.listed()
    return models_body(call.model_name, int(time.time()), modalities, adapters)


async def catalogue_models(call: Call) -> bytes:
    """GET /models: every model with its status, memory and expiry (`?reload=1`: the
    catalogue read anew first, as SIGHUP does)."""
    fleet = _fleet(call)
    if call.query.get("reload") not in (None, "", "0"):
        fleet.rescan()
    return catalogue_body(fleet.states(), int(time.time()))


async def load_model(call: Call) -> bytes:
    """POST /models/load {"model": NAME} (and "path": a new GGUF for it): load it now,
    waiting for the load."""
    path = call.body.get("path") if isinstance(call.body, dict) else None
    if path is not None and not isinstance(path, str):
        raise bad('"path" must be the path of a GGUF file.')
    try:
        await _fleet(call).load(_named(call), path)
    except EngineError as exc:
        raise engine_error(exc) from exc
    return SUCCESS


async def unload_model(call: Call) -> bytes:
    """POST /models/unload {"model": NAME}: unload it once its running requests end."""
    try:
        await _fleet(call).unload(_named(call))
    except EngineError as exc:
        raise engine_error(exc) from exc
    return SUCCESS


def _fleet(call: Call) -> Models:
    assert call.models is not None
    return call.models


def _named(call: Call) -> str:
    name = call.body.get("model") if isinstance(call.body, dict) else None
    if not isinstance(name, str) or not name:
        raise bad('The body needs "model": the name of a model (GET /models lists them).')
    return name


ROUTES = (
    Route("GET", "/v1/models", list_models, uses_model=False),
    Route("GET", "/models", catalogue_models, uses_model=False),
    Route("POST", "/models/load", load_model, uses_model=False),
    Route("POST", "/models/unload", unload_model, uses_model=False),
)
