"""POST /v1/embeddings: OpenAI's embeddings, mean-pooled from the served model (or the
--embedding-model), embedded in the engine thread beside chat."""

from __future__ import annotations

from dataclasses import replace

from edgeserve.api.common.call import Call, Route
from edgeserve.api.embeddings.render import embeddings_body
from edgeserve.api.embeddings.translate import (
    embeddings_engine_error,
    parse_embedding_request,
    prepare_embeddings,
)
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.api.reference.limits import bad
from edgeserve.errors import EngineError


async def embeddings(call: Call) -> bytes:
    """Validate, embed, answer in OpenAI's shape."""
    req = await call.off_loop(parse_embedding_request, call.body)
    try:
        size = call.engine.embedding_size
    except EngineError as exc:
        raise engine_error(exc) from exc
    work, names = await call.off_loop(prepare_embeddings, req, call.limits, size)
    adapters = call.adapters()
    if adapters and call.engine.dedicated_embeddings:
        raise bad(Detail.ADAPTERS_NOT_EMBEDDED)
    work = replace(work, adapters=adapters)
    async with call.engine_work():  # a cancelled embed() aborts the work
        try:
            result = await call.engine.embed(work)
        except EngineError as exc:
            raise embeddings_engine_error(exc, names) from exc
    call.record.prompt_tokens = result.n_tokens
    model = call.model_name if req.model is None else req.model
    return await call.off_loop(
        embeddings_body, model, result.vectors, req.encoding_format, result.n_tokens
    )


ROUTES = (Route("POST", "/v1/embeddings", embeddings),)
