"""POST /v1/chat/completions, streamed (SSE) and not."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from edgeserve import responses, validation
from edgeserve.engine.client import Generation
from edgeserve.engine.types import (
    Finished,
    PromptInfo,
    TextDelta,
    TokenLogprob,
)
from edgeserve.errors import EngineError
from edgeserve.http.handlers.common import (
    checked_request,
    engine_errors,
    log_prompt,
    stream_failure,
)
from edgeserve.http.keys import ENGINE, RECORD, SETTINGS
from edgeserve.http.sse import EventStream
from edgeserve.logprobs import AlignedLogprob, LogprobAligner
from edgeserve.protocol import ChatCompletionRequest, Finish
from edgeserve.tool_calls import parse_tool_calls
from edgeserve.tool_stream import Content, ToolCallStream


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Validate everything first, wait for admission, then answer as JSON or as a stream."""
    req, work = await checked_request(
        request, validation.parse_chat_request, validation.prepare_chat
    )
    engine = request.app[ENGINE]
    settings = request.app[SETTINGS]
    if settings.log_prompts:
        log_prompt(request, work)
    started = time.perf_counter()
    # --request-timeout-s counts from here (queue wait included). Before the response starts it
    # is a 504 JSON error; a stream that started ends with an error event (see _stream).
    deadline = asyncio.get_running_loop().time() + settings.request_timeout_s
    limit = asyncio.timeout_at(deadline)
    async with engine_errors(limit, settings.request_timeout_s), engine.generate(work) as gen:
        request[RECORD].generations.append(gen)
        async with limit:
            info = await gen.admitted()
            if not req.stream:
                return await _collect(request, req, gen, info, started)
        return await _stream(request, req, gen, info, started, deadline)


async def _collect(
    request: web.Request,
    req: ChatCompletionRequest,
    gen: Generation,
    info: PromptInfo,
    started: float,
) -> web.Response:
    texts = [""] * req.n
    reasons = ["length"] * req.n
    entries: list[list[AlignedLogprob]] = [[] for _ in range(req.n)]
    aligner = LogprobAligner()
    completion = 0
    cached = 0
    first: float | None = None
    async for event in gen.events():
        entries[event.index] += aligner.feed(event)
        if isinstance(event, TextDelta):
            first = first or time.perf_counter()
            texts[event.index] += event.text
        elif isinstance(event, Finished):
            reasons[event.index] = event.reason
            completion += event.completion_tokens
            cached = event.cached_tokens
    request[RECORD].generated(
        info.prompt_tokens, completion, cached or info.cached_tokens, started, first
    )
    calls = (
        [parse_tool_calls(text) for text in texts] if validation.tool_calls_wanted(req) else None
    )
    body = responses.chat_completion_body(
        responses.new_completion_id(),
        req.model,
        list(zip(texts, reasons, strict=True)),
        info.prompt_tokens,
        completion,
        cached or None,
        tool_calls=calls,
        logprobs=entries if req.logprobs else None,
    )
    return web.Response(body=body, content_type="application/json")


async def _stream(
    request: web.Request,
    req: ChatCompletionRequest,
    gen: Generation,
    info: PromptInfo,
    started: float,
    deadline: float,
) -> web.StreamResponse:
    cid = responses.new_completion_id()
    created = int(time.time())
    completion = 0
    cached = 0
    first: float | None = None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    aligner = LogprobAligner()
    # With tools, the answer is read for calls as it streams (README divergence 10): text is
    # held while it may still be a call, so the log-probabilities of held tokens wait for the
    # next event.
    calls = ToolCallStream() if validation.tool_calls_wanted(req) else None
    unsent: list[AlignedLogprob] = []
    stream = EventStream(request, request.app[SETTINGS].ping_interval_s)
    async with stream:
        if not await stream.send(responses.role_chunk(cid, req.model, created)):
            return stream.response
        limit = asyncio.timeout_at(deadline)
        try:
            async with limit:
                async for event in gen.events():
                    unsent += aligner.feed(event)
                    if isinstance(event, TokenLogprob):
                        continue
                    logprobs = unsent if req.logprobs else None
                    if isinstance(event, TextDelta):
                        first = first or time.perf_counter()
                        pieces = calls.feed(event.text) if calls else [Content(event.text)]
                        chunks = responses.piece_chunks(cid, req.model, created, pieces, logprobs)
                    else:
                        completion = event.completion_tokens
                        cached = event.cached_tokens
                        pieces = calls.finish() if calls else []
                        chunks = responses.piece_chunks(cid, req.model, created, pieces, logprobs)
                        finish = (
                            Finish.TOOL
                            if calls and calls.called
                            else responses.wire_finish_reason(event.reason)
                        )
                        rest = None if chunks or not unsent else logprobs
                        chunks.append(responses.finish_chunk(cid, req.model, created, finish, rest))
                    if chunks:
                        unsent = []
                    for chunk in chunks:
                        if not await stream.send(chunk):
                            return stream.response
        except EngineError as exc:
            await stream.send(stream_failure(request, exc))
            await stream.send(responses.sse_event("[DONE]"))
            return stream.response
        except TimeoutError as exc:
            if not limit.expired():
                raise
            request[RECORD].generated(
                info.prompt_tokens, completion, cached or info.cached_tokens, started, first
            )
            await stream.send(stream_failure(request, exc))
            await stream.send(responses.sse_event("[DONE]"))
            return stream.response
        if include_usage:
            usage = responses.usage_chunk(
                cid, req.model, created, info.prompt_tokens, completion, cached or None
            )
            await stream.send(usage)
        await stream.send(responses.sse_event("[DONE]"))
        request[RECORD].generated(
            info.prompt_tokens, completion, cached or info.cached_tokens, started, first
        )
    return stream.response
