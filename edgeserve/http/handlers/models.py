"""GET /v1/models."""

from __future__ import annotations

import time

from aiohttp import web

from edgeserve import responses
from edgeserve.http.handlers.common import check_key
from edgeserve.http.keys import SETTINGS


async def list_models(request: web.Request) -> web.Response:
    """One model card whose id is the configured model name."""
    settings = request.app[SETTINGS]
    check_key(request)
    body = responses.models_body(settings.model_name, int(time.time()))
    return web.Response(body=body, content_type="application/json")
