"""POST /v1/responses (OpenAI Responses API, stateless), streamed (SSE) and not.

The request is translated to a chat request (validation.prepare_responses) and generated as
chat generates it; only the answer's shape differs (edgeserve.responses_api).
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from edgeserve import responses_api, validation
from edgeserve.engine.client import Generation
from edgeserve.engine.types import Finished, PromptInfo, TextDelta
from edgeserve.errors import EngineError
from edgeserve.http.handlers.common import (
    checked_request,
    engine_errors,
    log_prompt,
    stream_failure,
)
from edgeserve.http.keys import ENGINE, RECORD, SETTINGS
from edgeserve.http.sse import EventStream
from edgeserve.protocol import ResponsesRequest
from edgeserve.tool_calls import parse_tool_calls
from edgeserve.tool_stream import Content, ToolCallStream


async def create_response(request: web.Request) -> web.StreamResponse:
    """Validate everything first, wait for admission, then answer as JSON or as a stream."""
    req, work = await checked_request(
        request, validation.parse_responses_request, validation.prepare_responses
    )
    engine = request.app[ENGINE]
    settings = request.app[SETTINGS]
    if settings.log_prompts:
        log_prompt(request, work.generation)
    started = time.perf_counter()
    deadline = asyncio.get_running_loop().time() + settings.request_timeout_s
    limit = asyncio.timeout_at(deadline)
    tools = validation.tool_calls_wanted(work.chat)
    async with (
        engine_errors(limit, settings.request_timeout_s),
        engine.generate(work.generation) as gen,
    ):
        request[RECORD].generations.append(gen)
        async with limit:
            info = await gen.admitted()
            if not req.stream:
                return await _collect(request, req, gen, info, started, tools)
        return await _stream(request, req, gen, info, started, deadline, tools)


async def _collect(
    request: web.Request,
    req: ResponsesRequest,
    gen: Generation,
    info: PromptInfo,
    started: float,
    tools: bool,
) -> web.Response:
    text = ""
    reason = "length"
    completion = 0
    cached = 0
    first: float | None = None
    async for event in gen.events():
        if isinstance(event, TextDelta):
            first = first or time.perf_counter()
            text += event.text
        elif isinstance(event, Finished):
            reason = event.reason
            completion = event.completion_tokens
            cached = event.cached_tokens
    cached = cached or info.cached_tokens
    request[RECORD].generated(info.prompt_tokens, completion, cached, started, first)
    usage = responses_api.response_usage(info.prompt_tokens, completion, cached)
    calls = parse_tool_calls(text) if tools else None
    body = responses_api.response_body(req, text, calls, reason, usage)
    return web.Response(body=body, content_type="application/json")


async def _stream(
    request: web.Request,
    req: ResponsesRequest,
    gen: Generation,
    info: PromptInfo,
    started: float,
    deadline: float,
    tools: bool,
) -> web.StreamResponse:
    events = responses_api.ResponseStream(req)
    calls = ToolCallStream() if tools else None
    completion = 0
    cached = 0
    first: float | None = None
    stream = EventStream(request, request.app[SETTINGS].ping_interval_s)
    async with stream:
        for chunk in events.start():
            if not await stream.send(chunk):
                return stream.response
        limit = asyncio.timeout_at(deadline)
        try:
            async with limit:
                async for event in gen.events():
                    if isinstance(event, TextDelta):
                        first = first or time.perf_counter()
                        pieces = calls.feed(event.text) if calls else [Content(event.text)]
                        chunks = events.feed(pieces)
                    elif isinstance(event, Finished):
                        completion = event.completion_tokens
                        cached = event.cached_tokens or info.cached_tokens
                        usage = responses_api.response_usage(info.prompt_tokens, completion, cached)
                        chunks = events.feed(calls.finish() if calls else [])
                        chunks += events.finish(event.reason, usage)
                    else:
                        continue
                    for chunk in chunks:
                        if not await stream.send(chunk):
                            return stream.response
        except EngineError as exc:
            await stream.send(stream_failure(request, exc))
            return stream.response
        except TimeoutError as exc:
            if not limit.expired():
                raise
            request[RECORD].generated(
                info.prompt_tokens, completion, cached or info.cached_tokens, started, first
            )
            await stream.send(stream_failure(request, exc))
            return stream.response
        request[RECORD].generated(
            info.prompt_tokens, completion, cached or info.cached_tokens, started, first
        )
    return stream.response
