"""What operators poll: GET /health (never needs a key; 503 while loading or draining, else
200) and GET /metrics (Prometheus text; needs the API key when one is set)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from aiohttp import web

from edgeserve import metrics
from edgeserve.api.common.media import input_modalities
from edgeserve.catalogue.fleet import Fleet
from edgeserve.catalogue.status import Status
from edgeserve.http.keys import METRICS, MODELS, SETTINGS
from edgeserve.http.request import check_key


async def health(request: web.Request) -> web.Response:
    """Readiness and load in one small JSON object: of the model with --model alone; with a
    catalogue, ready while any model can serve (loaded, or loadable on demand), each model's
    status listed."""
    models = request.config_dict[MODELS]
    if models.single:
        return _health_response(_engine_health(request, models))
    listed = [{"id": h.entry.id, "status": h.status.value} for h in models.models()]
    draining = models.closing
    usable = any(entry["status"] != Status.FAILED.value for entry in listed)
    status = "draining" if draining else "ok" if usable else "unavailable"
    return _health_response({"status": status, "models": listed})


def _engine_health(request: web.Request, models: Fleet) -> dict[str, object]:
    client = models.client(None)
    assert client is not None
    stats = client.stats()
    if not stats.loaded:
        status = "loading"
    elif stats.draining:
        status = "draining"
    else:
        status = "ok"
    return {
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
        "input_modalities": input_modalities(client.media_kinds),
        "prompt_cache": [asdict(tier) for tier in stats.prompt_cache_tiers],
    }


def _health_response(body: dict[str, object]) -> web.Response:
    return web.Response(
        status=200 if body["status"] == "ok" else 503,
        text=json.dumps(body, separators=(",", ":")),
        content_type="application/json",
    )


async def prometheus_metrics(request: web.Request) -> web.Response:
    """The app's registry in the classic text format, engine figures read now."""
    check_key(request)
    body = request.config_dict[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})
