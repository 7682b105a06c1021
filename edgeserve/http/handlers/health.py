"""GET /health: never needs a key; 503 while loading or draining, else 200."""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from edgeserve.http.keys import ENGINE, SETTINGS


async def health(request: web.Request) -> web.Response:
    """Readiness and load in one small JSON object."""
    stats = request.app[ENGINE].stats()
    if not stats.loaded:
        status = "loading"
    elif stats.draining:
        status = "draining"
    else:
        status = "ok"
    body = {
        "status": status,
        "model": request.app[SETTINGS].model_name,
        "n_ctx": stats.n_ctx,
        "parallel": stats.parallel,
        "busy_slots": stats.busy_slots,
        "queue_length": stats.queue_length,
        "kv_cells_used": stats.kv_cells_used,
        "gpu_offload": stats.gpu_offload,
        "n_gpu_layers": stats.n_gpu_layers,
        "draft_model": Path(stats.draft_model).name if stats.draft_model else None,
    }
    return web.Response(
        status=200 if status == "ok" else 503,
        text=json.dumps(body, separators=(",", ":")),
        content_type="application/json",
    )
