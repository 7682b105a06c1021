"""Ollama's POST /api/embed (several texts) and POST /api/embeddings (its older one-prompt
endpoint): the engine's L2-normalised vectors, as /v1/embeddings makes them."""

from __future__ import annotations

import time
from typing import Any

from edgeserve.api.common.call import Call
from edgeserve.api.ollama.options import read_options
from edgeserve.api.ollama.render import NS, json_body
from edgeserve.api.ollama.wire import EmbeddingsRequest, EmbedRequest
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.api.reference.limits import bad, check_unicode
from edgeserve.api.reference.request import parse_body
from edgeserve.engine.types import EmbedRequest as EngineEmbed
from edgeserve.errors import EngineError


async def embed(call: Call) -> bytes:
    """POST /api/embed: one L2-normalised vector per input."""
    req = await call.off_loop(parse_body, EmbedRequest, call.body)
    texts = [req.input] if isinstance(req.input, str) else req.input
    vectors, count = await _embed(call, req.model, texts, req.options, req.dimensions)
    payload = {
        "model": req.model,
        "embeddings": vectors,
        "total_duration": round((time.perf_counter() - call.record.started) * NS),
        "load_duration": round(call.record.load_s * NS),
        "prompt_eval_count": count,
    }
    return await call.off_loop(json_body, payload)


async def embeddings(call: Call) -> bytes:
    """POST /api/embeddings (Ollama's older endpoint): the prompt's vector (L2-normalised
    here; empty for an empty prompt, as at Ollama)."""
    req = await call.off_loop(parse_body, EmbeddingsRequest, call.body)
    texts = [req.prompt] if req.prompt else []
    vectors, _ = await _embed(call, req.model, texts, req.options, None)
    return await call.off_loop(json_body, {"embedding": vectors[0] if vectors else []})


async def _embed(
    call: Call,
    model: str | None,
    texts: list[str],
    options: dict[str, Any] | None,
    dimensions: int | None,
) -> tuple[list[list[float]], int]:
    """The vectors of `texts` and the tokens read, after the embeddings checks."""
    read_options(options, call.limits)
    if len(texts) > call.limits.max_embed_inputs:
        limit = call.limits.max_embed_inputs
        raise bad(Detail.TOO_MANY_INPUTS.format(count=len(texts), limit=limit))
    check_unicode([("model", model), *((f"input[{i}]", t) for i, t in enumerate(texts))])
    if not texts:
        return [], 0
    try:
        size = call.engine.embedding_size
    except EngineError as exc:
        raise engine_error(exc) from exc
    if dimensions is not None and dimensions != size:
        raise bad(Detail.DIMENSIONS_UNSUPPORTED.format(value=dimensions, size=size))
    async with call.engine_work():
        result = await call.engine.embed(EngineEmbed(tuple(texts), adapters=call.adapters()))
    call.record.prompt_tokens = result.n_tokens
    return [vector.tolist() for vector in result.vectors], result.n_tokens
