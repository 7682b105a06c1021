"""The tokenizer endpoints vLLM serves and lm-evaluation-harness's remote tokenizer reads:
POST /tokenize, POST /detokenize, GET /tokenizer_info. Tokenizing and detokenizing run on the
engine's prepare threads, and a large request's parsing and answer off the event loop."""

from __future__ import annotations

import asyncio

from aiohttp import web

from edgeserve import responses, validation
from edgeserve.errors import EngineError
from edgeserve.http.handlers.common import (
    authenticated_body,
    check_key,
    engine_errors,
    off_loop,
)
from edgeserve.http.keys import ENGINE, SETTINGS


async def tokenize(request: web.Request) -> web.Response:
    """`{"prompt"}` (or llama-server's `{"content"}`) → `{"tokens", "count", "max_model_len"}`."""
    body, large = await authenticated_body(request)
    req = await off_loop(large, validation.parse_tokenize_request, body)
    work = await off_loop(large, validation.prepare_tokenize, req)
    seconds = request.app[SETTINGS].request_timeout_s
    limit = asyncio.timeout(seconds)
    engine = request.app[ENGINE]
    async with engine_errors(limit, seconds), limit:
        tokens = await engine.tokenize(work)
    answer = await off_loop(large, responses.tokenize_body, tokens, engine.stats().n_ctx)
    return web.Response(body=answer, content_type="application/json")


async def detokenize(request: web.Request) -> web.Response:
    """`{"tokens"}` → `{"prompt", "content"}`: the tokens' text, special tokens included."""
    body, large = await authenticated_body(request)
    req = await off_loop(large, validation.parse_detokenize_request, body)
    seconds = request.app[SETTINGS].request_timeout_s
    limit = asyncio.timeout(seconds)
    async with engine_errors(limit, seconds), limit:
        try:
            text = await request.app[ENGINE].detokenize(tuple(req.tokens), special=True)
        except EngineError as exc:
            raise validation.token_engine_error(exc, "tokens") from exc
    answer = await off_loop(large, responses.detokenize_body, text)
    return web.Response(body=answer, content_type="application/json")


async def tokenizer_info(request: web.Request) -> web.Response:
    """The special tokens, whether BOS/EOS are added, the context size and the chat template."""
    check_key(request)
    try:
        info = request.app[ENGINE].tokenizer_info()
    except EngineError as exc:
        raise validation.engine_error(exc) from exc
    return web.Response(body=responses.tokenizer_info_body(info), content_type="application/json")
