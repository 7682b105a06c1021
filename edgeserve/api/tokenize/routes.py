"""The tokenizer endpoints vLLM serves and lm-evaluation-harness's remote tokenizer reads:
POST /tokenize, POST /detokenize, GET /tokenizer_info. Tokenizing and detokenizing run on the
engine's prepare threads, and a large request's parsing and answer off the event loop."""

from __future__ import annotations

from edgeserve.api.common.call import Call, Route
from edgeserve.api.common.media import input_modalities
from edgeserve.api.reference.engine_errors import engine_error, token_engine_error
from edgeserve.api.tokenize.render import detokenize_body, tokenize_body, tokenizer_info_body
from edgeserve.api.tokenize.translate import (
    parse_detokenize_request,
    parse_tokenize_request,
    prepare_tokenize,
)
from edgeserve.errors import EngineError


async def tokenize(call: Call) -> bytes:
    """`{"prompt"}` (or llama-server's `{"content"}`) → `{"tokens", "count", "max_model_len"}`."""
    req = await call.off_loop(parse_tokenize_request, call.body)
    work = await call.off_loop(prepare_tokenize, req)
    async with call.engine_work():
        tokens = await call.engine.tokenize(work)
    return await call.off_loop(tokenize_body, tokens, call.engine.stats().n_ctx)


async def detokenize(call: Call) -> bytes:
    """`{"tokens"}` → `{"prompt", "content"}`: the tokens' text, special tokens included."""
    req = await call.off_loop(parse_detokenize_request, call.body)
    async with call.engine_work():
        try:
            text = await call.engine.detokenize(tuple(req.tokens), special=True)
        except EngineError as exc:
            raise token_engine_error(exc, "tokens") from exc
    return await call.off_loop(detokenize_body, text)


async def tokenizer_info(call: Call) -> bytes:
    """The special tokens, whether BOS/EOS are added, the context size, the chat template and
    the input modalities."""
    try:
        info = call.engine.tokenizer_info()
    except EngineError as exc:
        raise engine_error(exc) from exc
    return tokenizer_info_body(info, input_modalities(call.engine.media_kinds))


ROUTES = (
    Route("POST", "/tokenize", tokenize),
    Route("POST", "/detokenize", detokenize),
    Route("GET", "/tokenizer_info", tokenizer_info),
)
