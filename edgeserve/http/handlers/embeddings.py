"""POST /v1/embeddings: OpenAI's embeddings, mean-pooled from the served model."""

from __future__ import annotations

import asyncio

from aiohttp import web

from edgeserve import responses, validation
from edgeserve.errors import EngineError
from edgeserve.http.handlers.common import authenticated_body, engine_errors, off_loop
from edgeserve.http.keys import ENGINE, LIMITS, RECORD, SETTINGS


async def embeddings(request: web.Request) -> web.Response:
    """Validate, embed in the engine thread (beside chat), answer in OpenAI's shape."""
    body, large = await authenticated_body(request)
    req = await off_loop(large, validation.parse_embedding_request, body)
    engine = request.app[ENGINE]
    settings = request.app[SETTINGS]
    try:
        size = engine.embedding_size
    except EngineError as exc:
        raise validation.engine_error(exc) from exc
    work, names = await off_loop(
        large, validation.prepare_embeddings, req, request.app[LIMITS], size
    )
    seconds = settings.request_timeout_s
    limit = asyncio.timeout(seconds)
    async with engine_errors(limit, seconds), limit:  # a cancelled embed() aborts the work
        try:
            result = await engine.embed(work)
        except EngineError as exc:
            raise validation.embeddings_engine_error(exc, names) from exc
    request[RECORD].prompt_tokens = result.n_tokens
    model = settings.model_name if req.model is None else req.model
    answer = await off_loop(
        large,
        responses.embeddings_body,
        model,
        result.vectors,
        req.encoding_format,
        result.n_tokens,
    )
    return web.Response(body=answer, content_type="application/json")
