"""The aiohttp application factory: each API package's routes mounted on the one generation
path (generating APIs) or a plain JSON handler; Anthropic's as a sub-application whose errors
have Anthropic's shape, Ollama's (under /api, which a --root-path may also be) with Ollama's
error shape by path.

The model list, chat and Anthropic's Messages load with the app; the other APIs' packages
(their wire models, checks and rendering) are imported by their first request (`LazyApi`), so
a server that never serves them does not hold them."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from importlib import import_module
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler

from edgeserve.api.anthropic_messages import routes as anthropic_messages
from edgeserve.api.common.call import Route
from edgeserve.api.models import routes as models
from edgeserve.api.ollama import routes as ollama
from edgeserve.api.openai_chat import routes as openai_chat
from edgeserve.api.reference.limits import Limits
from edgeserve.catalogue.fleet import Fleet
from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.http import chat_page, middlewares
from edgeserve.http.generation import generation_handler
from edgeserve.http.keys import (
    ERRORS,
    KNOWN_PATHS,
    LIMITS,
    MEDIA_LIMITS,
    METRICS,
    MODELS,
    PATH_ERRORS,
    SETTINGS,
    ErrorResponder,
)
from edgeserve.http.media_fetch import HttpMediaFetcher
from edgeserve.http.operations import health, prometheus_metrics
from edgeserve.http.request import call_for
from edgeserve.metrics import Metrics

API_ROUTES: tuple[Route, ...] = (*models.ROUTES, *openai_chat.ROUTES)
"""The APIs, of those whose errors have the reference's shape, that load with the app."""

Method = Literal["GET", "POST"]


@dataclass(frozen=True)
class LazyApi:
    """An API whose package is imported by its first request: its routes module, and the
    method and path of each route it declares (mounted at start; tests/unit/test_import_seams.py
    checks them against the module's ROUTES)."""

    module: str
    paths: tuple[tuple[Method, str], ...]


LAZY_APIS = (
    LazyApi("edgeserve.api.openai_completions.routes", (("POST", "/v1/completions"),)),
    LazyApi("edgeserve.api.openai_responses.routes", (("POST", "/v1/responses"),)),
    LazyApi("edgeserve.api.score.routes", (("POST", "/v1/score/evaluation"),)),
    LazyApi("edgeserve.api.embeddings.routes", (("POST", "/v1/embeddings"),)),
    LazyApi(
        "edgeserve.api.tokenize.routes",
        (("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/tokenizer_info")),
    ),
    LazyApi(
        "edgeserve.api.lora_adapters.routes",
        (("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter")),
    ),
)
"""The other APIs whose errors have the reference's shape (~2 MiB of memory together)."""

ANTHROPIC_PREFIX = "/v1/messages"


def create_app(
    settings: Settings, models: Fleet | EngineClient, limits: Limits | None = None
) -> web.Application:
    """Build the app around the models the caller owns (a fleet it starts and closes, or one
    engine of --model alone). Media URLs are downloaded by an HttpMediaFetcher open while the
    app runs, unless `limits` bring a fetcher of their own.

    Routes answer with and without `settings.root_path`, as the reference's root_path does.
    The chat page is at `/` (and `root_path/`) unless `settings.no_webui`.
    """
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[
            middlewares.request_context,
            middlewares.trusted_host,
            middlewares.cors,
            middlewares.api_errors,
        ],
    )
    if not isinstance(models, Fleet):
        models = Fleet.serving(settings.model_name, models, settings.engine_config())
    app[SETTINGS] = settings
    app[MODELS] = models
    app[METRICS] = Metrics(models.stats, labelled=not models.single)
    app[ERRORS] = middlewares.reference_error_response
    limits = limits or replace(
        Limits.from_env(os.environ),
        max_n=settings.max_n,
        max_tokens=settings.max_tokens_cap,
        max_score_texts=settings.max_score_texts,
        max_media_items=settings.max_media_per_request,
        max_media_bytes=settings.max_media_bytes,
        allow_private_media_urls=settings.allow_private_media_urls,
    )
    if limits.fetcher is None:
        fetcher = HttpMediaFetcher(
            timeout_s=settings.media_fetch_timeout_s,
            allow_private=settings.allow_private_media_urls,
        )
        app.cleanup_ctx.append(functools.partial(_media_fetcher, fetcher))
        limits = replace(limits, fetcher=fetcher)
    app[LIMITS] = limits
    app[MEDIA_LIMITS] = {}
    paths: set[str] = set()
    path_errors: dict[str, ErrorResponder] = {}  # routes of the main app with their own shape
    app[PATH_ERRORS] = path_errors
    page = {} if settings.no_webui else chat_page.load_assets()
    for prefix in [""] + ([settings.root_path] if settings.root_path else []):
        _add_routes(app, prefix, API_ROUTES, paths)
        _add_lazy_routes(app, prefix, LAZY_APIS, paths)
        if page:
            paths.update(chat_page.add_routes(app.router, prefix, page))
        app.router.add_get(prefix + "/health", health, allow_head=False)
        app.router.add_get(prefix + "/metrics", prometheus_metrics, allow_head=False)
        paths.update({prefix + "/health", prefix + "/metrics"})
        anthropic = web.Application(middlewares=[middlewares.api_errors])
        anthropic[ERRORS] = middlewares.anthropic_error_response
        _add_routes(anthropic, "", _relative(anthropic_messages.ROUTES), set())
        app.add_subapp(prefix + ANTHROPIC_PREFIX, anthropic)
        paths.update(prefix + route.path for route in anthropic_messages.ROUTES)
        ollama_paths: set[str] = set()
        _add_routes(app, prefix, ollama.ROUTES, ollama_paths)
        path_errors.update(dict.fromkeys(ollama_paths, middlewares.ollama_error_response))
        paths.update(ollama_paths)
        app.router.add_route("HEAD", prefix + "/", ollama_liveness)
        if not page:  # GET / stays the reference's 404 beside Ollama's HEAD /
            app.router.add_get(prefix + "/", no_page, allow_head=False)
    app[KNOWN_PATHS] = frozenset(paths)
    return app


async def _media_fetcher(fetcher: HttpMediaFetcher, app: web.Application) -> AsyncIterator[None]:
    """The media downloads' session, open while the app runs."""
    await fetcher.start()
    yield
    await fetcher.close()


def _relative(routes: Sequence[Route]) -> list[Route]:
    """Anthropic's routes under the sub-application's prefix."""
    return [replace(route, path=route.path.removeprefix(ANTHROPIC_PREFIX)) for route in routes]


async def ollama_liveness(request: web.Request) -> web.Response:
    """`HEAD /`, Ollama's liveness check (GET / stays the chat page)."""
    return web.Response(text="Ollama is running")


async def no_page(request: web.Request) -> web.Response:
    """`GET /` with --no-webui: the reference's 404."""
    raise web.HTTPNotFound()


def _add_routes(
    app: web.Application, prefix: str, routes: Sequence[Route], paths: set[str]
) -> None:
    for route in routes:
        _mount(app, route.method, prefix + route.path, _handler(route))
        paths.add(prefix + route.path)


def _add_lazy_routes(
    app: web.Application, prefix: str, apis: Sequence[LazyApi], paths: set[str]
) -> None:
    for api in apis:
        for method, path in api.paths:
            _mount(app, method, prefix + path, _lazy_handler(api.module, method, path))
            paths.add(prefix + path)


def _mount(app: web.Application, method: Method, path: str, handler: Handler) -> None:
    if method == "GET":
        app.router.add_get(path, handler, allow_head=False)
    else:
        app.router.add_route(method, path, handler)


def _lazy_handler(module: str, method: Method, path: str) -> Handler:
    """The handler of `module`'s route at `method` `path`, made by its first request, which
    imports the module on a worker thread (the event loop serves the others meanwhile; two
    first requests at once both wait for the one import)."""
    handler: Handler | None = None

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal handler
        if handler is None:
            routes = (await asyncio.to_thread(import_module, module)).ROUTES
            handler = _handler(next(r for r in routes if (r.method, r.path) == (method, path)))
        return await handler(request)

    return handle


def _handler(route: Route) -> Handler:
    """A generating API on the generation path; any other endpoint answers one JSON body."""
    endpoint = route.endpoint
    if not callable(endpoint):
        return generation_handler(endpoint, route.names, route.streams, route.unloads)
    unary = endpoint
    with_body = route.method != "GET"
    uses_model, names = route.uses_model, route.names

    async def handle(request: web.Request) -> web.StreamResponse:
        call = await call_for(request, with_body=with_body, uses_model=uses_model, names=names)
        return web.Response(body=await unary(call), content_type="application/json")

    return handle
