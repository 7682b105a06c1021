"""What operators poll: GET /health (never needs a key; 503 while loading or draining, else
200) and GET /metrics (Prometheus text; needs the API key when one is set)."""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from edgeserve import metrics
from edgeserve.api.common.media import input_modalities
from edgeserve.http.keys import ENGINE, METRICS, SETTINGS
from edgeserve.http.request import check_key


async def health(request: web.Request) -> web.Response:
    """Readiness and load in one small JSON object."""
    stats = request.config_dict[ENGINE].stats()
    if not stats.loaded:
        status = "loading"
    elif stats.draining:
        status = "draining"
    else:
        status = "ok"
    body = {
        "status": status,
        "model": request.config_dict[SETTINGS].model_name,
        "n_ctx": stats.n_ctx,
        "parallel": stats.parallel,
        "busy_slots": stats.busy_slots,
        "queue_length": stats.queue_length,
        "kv_cells_used": stats.kv_cells_used,
        "gpu_offload": stats.gpu_offload,
        "n_gpu_layers": stats.n_gpu_layers,
        "flash_attn": stats.flash_attn,
        "draft_model": Path(stats.draft_model).name if stats.draft_model else None,
        "input_modalities": input_modalities(request.config_dict[ENGINE].media_kinds),
    }
    return web.Response(
        status=200 if status == "ok" else 503,
        text=json.dumps(body, separators=(",", ":")),
        content_type="application/json",
    )


async def prometheus_metrics(request: web.Request) -> web.Response:
    """The app's registry in the classic text format, engine figures read now."""
    check_key(request)
    body = request.config_dict[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})
