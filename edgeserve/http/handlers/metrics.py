"""GET /metrics: Prometheus text; needs the API key when one is set (only /health is public)."""

from __future__ import annotations

from aiohttp import web

from edgeserve import metrics
from edgeserve.http.handlers.common import check_key
from edgeserve.http.keys import METRICS


async def prometheus_metrics(request: web.Request) -> web.Response:
    """The app's registry in the classic text format, engine figures read now."""
    check_key(request)
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})
