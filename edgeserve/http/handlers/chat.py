"""POST /v1/chat/completions, streamed (SSE) and not."""

from __future__ import annotations

import time

from aiohttp import web

from edgeserve import responses, validation
from edgeserve.engine.client import Generation
from edgeserve.engine.types import Finished, PromptInfo, TextDelta
from edgeserve.errors import EngineError
from edgeserve.http.handlers.common import authenticated_body
from edgeserve.http.keys import ENGINE, LIMITS, RECORD, SETTINGS
from edgeserve.http.sse import EventStream
from edgeserve.protocol import ChatCompletionRequest


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Validate everything first, wait for admission, then answer as JSON or as a stream."""
    body = await authenticated_body(request)
    req = validation.parse_chat_request(body)
    engine = request.app[ENGINE]
    validation.check_can_generate(engine.can_generate)
    work = await validation.prepare_chat(req, request.app[LIMITS])
    started = time.perf_counter()
    try:
        async with engine.generate(work) as gen:
            info = await gen.admitted()
            if req.stream:
                return await _stream(request, req, gen, info, started)
            return await _collect(request, req, gen, info, started)
    except EngineError as exc:
        raise validation.engine_error(exc) from exc


async def _collect(
    request: web.Request,
    req: ChatCompletionRequest,
    gen: Generation,
    info: PromptInfo,
    started: float,
) -> web.Response:
    texts = [""] * req.n
    reasons = ["length"] * req.n
    completion = 0
    cached = 0
    first: float | None = None
    async for event in gen.events():
        if isinstance(event, TextDelta):
            first = first or time.perf_counter()
            texts[event.index] += event.text
        else:
            reasons[event.index] = event.reason
            completion += event.completion_tokens
            cached = event.cached_tokens
    _record(request, info, completion, started, first)
    body = responses.chat_completion_body(
        responses.new_completion_id(),
        req.model,
        list(zip(texts, reasons, strict=True)),
        info.prompt_tokens,
        completion,
        cached or None,
    )
    return web.Response(body=body, content_type="application/json")


async def _stream(
    request: web.Request,
    req: ChatCompletionRequest,
    gen: Generation,
    info: PromptInfo,
    started: float,
) -> web.StreamResponse:
    cid = responses.new_completion_id()
    created = int(time.time())
    completion = 0
    cached = 0
    first: float | None = None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    stream = EventStream(request, request.app[SETTINGS].ping_interval_s)
    async with stream:
        if not await stream.send(responses.role_chunk(cid, req.model, created)):
            return stream.response
        try:
            async for event in gen.events():
                if isinstance(event, TextDelta):
                    first = first or time.perf_counter()
                    chunk = responses.content_chunk(cid, req.model, created, event.text)
                else:
                    assert isinstance(event, Finished)
                    completion = event.completion_tokens
                    cached = event.cached_tokens
                    chunk = responses.finish_chunk(cid, req.model, created, event.reason)
                if not await stream.send(chunk):
                    return stream.response
        except EngineError as exc:
            err = validation.engine_error(exc)
            await stream.send(responses.stream_error_event(err.status, err.detail))
            await stream.send(responses.sse_event("[DONE]"))
            return stream.response
        if include_usage:
            usage = responses.usage_chunk(
                cid, req.model, created, info.prompt_tokens, completion, cached or None
            )
            await stream.send(usage)
        await stream.send(responses.sse_event("[DONE]"))
        _record(request, info, completion, started, first)
    return stream.response


def _record(
    request: web.Request, info: PromptInfo, completion: int, started: float, first: float | None
) -> None:
    record = request[RECORD]
    record.prompt_tokens = info.prompt_tokens
    record.completion_tokens = completion
    if first is not None:
        record.ttft_s = first - started
        record.gen_s = time.perf_counter() - first
