"""Typed application and request keys (no string keys, no module globals)."""

from __future__ import annotations

import contextlib
from typing import Protocol

from aiohttp import web

from edgeserve.api.common.call import RequestRecord
from edgeserve.api.reference.limits import Limits
from edgeserve.catalogue.fleet import Fleet
from edgeserve.config import Settings
from edgeserve.engine.types import MediaKind
from edgeserve.errors import ApiError
from edgeserve.metrics import Metrics


class ErrorResponder(Protocol):
    """How an application answers a client error (its API's error shape)."""

    def __call__(self, request: web.Request, err: ApiError, /) -> web.Response: ...


SETTINGS = web.AppKey("edgeserve.settings", Settings)
MODELS = web.AppKey("edgeserve.models", Fleet)
LIMITS = web.AppKey("edgeserve.limits", Limits)
MEDIA_LIMITS = web.AppKey("edgeserve.media_limits", dict[frozenset[MediaKind], Limits])
METRICS = web.AppKey("edgeserve.metrics", Metrics)
KNOWN_PATHS = web.AppKey("edgeserve.known_paths", frozenset)
ERRORS = web.AppKey("edgeserve.errors", ErrorResponder)
PATH_ERRORS = web.AppKey("edgeserve.path_errors", dict[str, ErrorResponder])
"""Paths whose errors have their own API's shape (Ollama's), whatever app routed them."""
RECORD = web.RequestKey("edgeserve.record", RequestRecord)
LEASES = web.RequestKey("edgeserve.leases", contextlib.AsyncExitStack)
"""The models a request holds while it runs, released when it ends (middlewares.py)."""
