"""GET /metrics: Prometheus text; needs the API key when one is set (only /health is public)."""

from __future__ import annotations

from aiohttp import web

from edgeserve import metrics, validation
from edgeserve.http.keys import METRICS, SETTINGS


async def prometheus_metrics(request: web.Request) -> web.Response:
    """The app's registry in the classic text format, engine figures read now."""
    validation.check_api_key(request.headers.get("Authorization"), request.app[SETTINGS].api_keys)
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})
