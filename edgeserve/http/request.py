"""Steps every endpoint shares before its own: check the API key and the declared body size
from the headers, read and decode the body, and hand the endpoint a `Call` with the limits it
answers under.

The reference decodes the body before it checks the key (a malformed body is a 422 even
without a key). With a key set, edgeserve decides the key first and reads no byte of an
unauthorised body (divergence 22): reading and decoding 32 MiB of JSON costs ~770 MiB and a
second of CPU, which nobody without a key may spend. Without a key the order is the
reference's, since there is no key to check."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from edgeserve.api.common.call import Call, ModelNames
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.api.reference.limits import Limits
from edgeserve.api.reference.request import body_too_large, check_api_key, decode_json_body
from edgeserve.catalogue.fleet import Fleet, Held
from edgeserve.config import values
from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import MediaKind
from edgeserve.errors import EngineError
from edgeserve.http.keys import LEASES, LIMITS, MEDIA_LIMITS, MODELS, RECORD, SETTINGS

ALL_MEDIA_KINDS: frozenset[MediaKind] = frozenset({"image", "audio"})

# Bodies larger than this are decoded, validated and checked on a worker thread: a request of
# 100,000 chat messages takes over a second of CPU to parse and check, which on the event loop
# would stall every running stream for as long.
LARGE_BODY_BYTES = 256 * 1024


async def call_for(
    request: web.Request,
    *,
    with_body: bool,
    uses_model: bool = True,
    names: ModelNames | None = None,
    unloads: Callable[[Any], bool] | None = None,
) -> Call:
    """The request as an endpoint sees it: its API key checked (401), with `with_body` its
    declared size (413) before its JSON body is read and decoded, and with `uses_model` the
    model it names (the body's `model`, or a GET's `?model=`, read by the API's `names` when
    it has its own rules) held for as long as the request runs (404 for a name the catalogue
    lacks; a model not loaded loads first). A body that `unloads` says only unloads its model
    holds none and loads none: the model unloads once idle, and the call has no client."""
    check_key(request)
    settings = request.config_dict[SETTINGS]
    body = None
    large = False
    if with_body:
        declared = request.content_length
        if declared is not None and declared > settings.max_body_bytes:
            raise body_too_large(settings.max_body_bytes)
        raw = await request.read()
        large = len(raw) > LARGE_BODY_BYTES
        content_type = request.headers.get("Content-Type")
        if large:
            body = await asyncio.to_thread(decode_json_body, raw, content_type)
        else:
            body = decode_json_body(raw, content_type)
    models = request.config_dict[MODELS]
    model_name, client, projector = settings.model_name, None, bool(settings.mmproj)
    if uses_model and not models.single and unloads is not None and unloads(body):
        try:
            model_name = models.release(_model_named(request, models, body, names)).entry.id
        except EngineError as exc:
            raise engine_error(exc) from exc
    elif uses_model:
        held = await _lease(request, models, body, names)
        client, projector = held.client, bool(held.entry.config.mmproj_path)
        if not models.single:
            model_name = held.entry.id  # with --model alone, answers carry --model-name
    elif models.single:
        client = models.client(None)
    return Call(
        body=body,
        client=client,
        limits=limits_for(request, client, projector),
        model_name=model_name,
        timeout_s=settings.request_timeout_s,
        record=request[RECORD],
        large=large,
        allow_runtime_lora=settings.allow_runtime_lora,
        models=models,
        query=request.query,
    )


def _model_named(
    request: web.Request, models: Fleet, body: Any, names: ModelNames | None
) -> str | None:
    """The model the request names: the body's `model`, a GET's `?model=`, else --model's."""
    name = body.get("model") if isinstance(body, dict) else request.query.get("model")
    if names is not None:
        return names(name, models.catalogue.names())
    if not isinstance(name, str) or not name:
        return request.config_dict[SETTINGS].model_name or None
    return name


async def _lease(request: web.Request, models: Fleet, body: Any, names: ModelNames | None) -> Held:
    """The model the request names held until the request ends; how long that took to load
    it goes to the request's record."""
    name = _model_named(request, models, body, names)
    keep_alive = None
    if isinstance(body, dict) and "keep_alive" in body:
        with contextlib.suppress(ValueError):  # Ollama's field; a bad one keeps the default
            keep_alive = values.keep_alive(body["keep_alive"])
    started = time.perf_counter()
    try:
        held = await request[LEASES].enter_async_context(models.lease(name, keep_alive))
    except EngineError as exc:
        raise engine_error(exc) from exc
    request[RECORD].load_s = time.perf_counter() - started
    return held


def limits_for(request: web.Request, client: EngineClient | None, projector: bool) -> Limits:
    """The app's limits with the media the model takes, made once per set of media kinds.
    While a model with a projector (`projector`: --mmproj) loads, its kinds are not known
    yet: media pass the checks, and the engine answers 503 as it does to any request then."""
    kinds = client.media_kinds if client is not None else frozenset()
    if not kinds and projector:
        kinds = ALL_MEDIA_KINDS
    made = request.config_dict[MEDIA_LIMITS]
    limits = made.get(kinds)
    if limits is None:
        limits = made[kinds] = replace(request.config_dict[LIMITS], media_kinds=kinds)
    return limits


def check_key(request: web.Request) -> None:
    """401 unless the request carries a configured API key (as a bearer token or in
    Anthropic's `x-api-key` header)."""
    check_api_key(
        request.headers.get("Authorization"),
        request.config_dict[SETTINGS].api_keys,
        request.headers.get("x-api-key"),
    )
