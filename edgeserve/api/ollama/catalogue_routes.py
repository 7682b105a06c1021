"""Ollama's model routes: GET /api/tags, GET /api/ps, POST /api/show (from the catalogue's state
and each model's GGUF header; nothing loads), GET /api/version, and the registry's routes
(/api/pull, …), which answer that there is no registry."""

from __future__ import annotations

import asyncio

from edgeserve.api.common.call import Call, Unary
from edgeserve.api.ollama.listing import ps_entry, show_body, tags_entry
from edgeserve.api.ollama.names import served_name
from edgeserve.api.ollama.render import json_body
from edgeserve.api.ollama.wire import ShowRequest
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.request import parse_body
from edgeserve.catalogue.status import Models, Status
from edgeserve.errors import ApiError

VERSION = "0.8.0"
"""The Ollama release whose API these routes answer as: tools (streamed) and structured
outputs, and no thinking (Ollama 0.9 added `think`), so clients that read the version do not
ask for it."""


async def tags(call: Call) -> bytes:
    """GET /api/tags: every model of the catalogue (loaded or not)."""
    states = _models(call).states()
    entries = await asyncio.to_thread(lambda: [tags_entry(state) for state in states])
    return json_body({"models": entries})


async def ps(call: Call) -> bytes:
    """GET /api/ps: the loaded models, the one expiring last first (as Ollama orders them)."""
    states = [s for s in _models(call).states() if s.status is Status.LOADED]
    states.sort(key=lambda s: -(s.expires_at if s.expires_at is not None else float("inf")))
    entries = await asyncio.to_thread(lambda: [ps_entry(state) for state in states])
    return json_body({"models": entries})


async def show(call: Call) -> bytes:
    """POST /api/show: a model's template, parameters, details and GGUF metadata, without
    loading it."""
    req = await call.off_loop(parse_body, ShowRequest, call.body)
    states = _models(call).states()
    served = [name for state in states for name in (state.id, *state.aliases)]
    name = served_name(req.model or req.name, served)
    state = next(s for s in states if name in (s.id, *s.aliases))
    template = None
    if call.client is not None and call.client.loaded:
        template = call.client.tokenizer_info().chat_template
    return json_body(await asyncio.to_thread(show_body, state, template))


async def version(call: Call) -> bytes:
    """GET /api/version."""
    return json_body({"version": VERSION})


def no_registry(path: str) -> Unary:
    """/api/pull, /api/push, /api/create, /api/copy, /api/delete: 501, saying that models are
    the catalogue's files (nothing is downloaded, uploaded, made or removed)."""

    async def refuse(call: Call) -> bytes:
        raise ApiError(501, Detail.OLLAMA_NO_REGISTRY.format(path=path))

    return refuse


def _models(call: Call) -> Models:
    assert call.models is not None
    return call.models
