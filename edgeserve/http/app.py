"""The aiohttp application factory."""

from __future__ import annotations

import os
from dataclasses import replace

from aiohttp import web

from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.http import middlewares
from edgeserve.http.handlers.chat import chat_completions
from edgeserve.http.handlers.completions import completions
from edgeserve.http.handlers.embeddings import embeddings
from edgeserve.http.handlers.health import health
from edgeserve.http.handlers.messages import count_tokens, create_message
from edgeserve.http.handlers.metrics import prometheus_metrics
from edgeserve.http.handlers.models import list_models
from edgeserve.http.handlers.responses_api import create_response
from edgeserve.http.handlers.score import score_evaluation
from edgeserve.http.handlers.tokenize import detokenize, tokenize, tokenizer_info
from edgeserve.http.keys import ANTHROPIC_PATHS, ENGINE, KNOWN_PATHS, LIMITS, METRICS, SETTINGS
from edgeserve.metrics import Metrics
from edgeserve.validation import Limits

ROUTES = (
    ("GET", "/v1/models", list_models),
    ("POST", "/v1/chat/completions", chat_completions),
    ("POST", "/v1/completions", completions),
    ("POST", "/v1/responses", create_response),
    ("POST", "/v1/score/evaluation", score_evaluation),
    ("POST", "/v1/embeddings", embeddings),
    ("POST", "/tokenize", tokenize),
    ("POST", "/detokenize", detokenize),
    ("GET", "/tokenizer_info", tokenizer_info),
    ("GET", "/health", health),
    ("GET", "/metrics", prometheus_metrics),
)

ANTHROPIC_ROUTES = (
    ("POST", "/v1/messages", create_message),
    ("POST", "/v1/messages/count_tokens", count_tokens),
)
"""Anthropic's endpoints: their errors have Anthropic's shape."""


def create_app(
    settings: Settings, engine: EngineClient, limits: Limits | None = None
) -> web.Application:
    """Build the app around an engine that the caller owns (starts and closes).

    Routes answer with and without `settings.root_path`, as the reference's root_path does.
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
    app[SETTINGS] = settings
    app[ENGINE] = engine
    app[METRICS] = Metrics(engine.stats)
    app[LIMITS] = limits or replace(
        Limits.from_env(os.environ),
        max_n=settings.max_n,
        max_tokens=settings.max_tokens_cap,
        max_score_texts=settings.max_score_texts,
    )
    prefixes = [""] + ([settings.root_path] if settings.root_path else [])
    paths = set()
    anthropic = set()
    for prefix in prefixes:
        for method, path, handler in ROUTES + ANTHROPIC_ROUTES:
            full = prefix + path
            if method == "GET":
                app.router.add_get(full, handler, allow_head=False)
            else:
                app.router.add_route(method, full, handler)
            paths.add(full)
        anthropic.update(prefix + path for _, path, _ in ANTHROPIC_ROUTES)
    app[KNOWN_PATHS] = frozenset(paths)
    app[ANTHROPIC_PATHS] = frozenset(anthropic)
    return app
