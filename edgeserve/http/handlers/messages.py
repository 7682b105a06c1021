"""Anthropic's POST /v1/messages (streamed and not) and POST /v1/messages/count_tokens, on
chat's engine requests: validation builds the same ChatPrompt and sampling, tool calls are read
as chat reads them, and errors leave in Anthropic's shape (see middlewares.api_errors)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from edgeserve import messages, responses, validation
from edgeserve.engine.client import Generation
from edgeserve.engine.types import Finished, PromptInfo, TextDelta
from edgeserve.errors import ApiError, EngineError
from edgeserve.http.handlers.common import (
    authenticated_body,
    checked_request,
    engine_errors,
    log_prompt,
    off_loop,
)
from edgeserve.http.keys import ENGINE, RECORD, SETTINGS
from edgeserve.http.sse import EventStream
from edgeserve.protocol import MessagesRequest
from edgeserve.tool_calls import parse_tool_calls
from edgeserve.tool_stream import Content, ToolCallStream


async def create_message(request: web.Request) -> web.StreamResponse:
    """Validate everything first, wait for admission, then answer as JSON or as a stream."""
    req, work = await checked_request(
        request, validation.parse_messages_request, validation.prepare_messages
    )
    engine = request.app[ENGINE]
    calls_wanted = validation.messages_calls_wanted(req)
    settings = request.app[SETTINGS]
    if settings.log_prompts:
        log_prompt(request, work)
    started = time.perf_counter()
    deadline = asyncio.get_running_loop().time() + settings.request_timeout_s
    limit = asyncio.timeout_at(deadline)
    async with engine_errors(limit, settings.request_timeout_s), engine.generate(work) as gen:
        request[RECORD].generations.append(gen)
        async with limit:
            info = await gen.admitted()
            if not req.stream:
                return await _collect(request, req, gen, info, started, calls_wanted)
        return await _stream(request, req, gen, info, started, deadline, calls_wanted)


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's tokens, counted as /v1/messages would send them to the model."""
    body, large = await authenticated_body(request)
    req = await off_loop(large, validation.parse_count_tokens_request, body)
    prompt = await off_loop(large, validation.prepare_count_tokens, req)
    try:
        count = await request.app[ENGINE].count_prompt_tokens(prompt)
    except EngineError as exc:
        raise validation.engine_error(exc) from exc
    return web.Response(body=messages.count_tokens_body(count), content_type="application/json")


async def _collect(
    request: web.Request,
    req: MessagesRequest,
    gen: Generation,
    info: PromptInfo,
    started: float,
    calls_wanted: bool,
) -> web.Response:
    text = ""
    first: float | None = None
    finished: Finished | None = None
    async for event in gen.events():
        if isinstance(event, TextDelta):
            first = first or time.perf_counter()
            text += event.text
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None, "every generation ends with Finished"
    request[RECORD].generated(
        info.prompt_tokens, finished.completion_tokens, finished.cached_tokens, started, first
    )
    calls = parse_tool_calls(text) if calls_wanted else None
    body = messages.message_body(
        messages.new_message_id(), req.model, text, calls, finished, info.prompt_tokens
    )
    return web.Response(body=body, content_type="application/json")


async def _stream(
    request: web.Request,
    req: MessagesRequest,
    gen: Generation,
    info: PromptInfo,
    started: float,
    deadline: float,
    calls_wanted: bool,
) -> web.StreamResponse:
    """Anthropic's event sequence; a client that goes away ends the stream, and leaving
    `gen`'s context then aborts the generation."""
    writer = messages.MessageStream(messages.new_message_id(), req.model, info.prompt_tokens)
    calls = ToolCallStream() if calls_wanted else None
    first: float | None = None
    stream = EventStream(request, request.app[SETTINGS].ping_interval_s)
    async with stream:
        if not await stream.send(b"".join(writer.start())):
            return stream.response
        limit = asyncio.timeout_at(deadline)
        try:
            async with limit:
                async for event in gen.events():
                    if isinstance(event, TextDelta):
                        first = first or time.perf_counter()
                        pieces = calls.feed(event.text) if calls else [Content(event.text)]
                        events = writer.pieces(pieces)
                    elif isinstance(event, Finished):
                        request[RECORD].generated(
                            info.prompt_tokens,
                            event.completion_tokens,
                            event.cached_tokens,
                            started,
                            first,
                        )
                        events = writer.pieces(calls.finish()) if calls else []
                        events += writer.finish(event, bool(calls and calls.called))
                    else:
                        continue
                    for data in events:
                        if not await stream.send(data):
                            return stream.response
        except EngineError as exc:
            await _send_error(request, stream, validation.engine_error(exc))
        except TimeoutError:
            if not limit.expired():
                raise
            timeout_s = request.app[SETTINGS].request_timeout_s
            await _send_error(request, stream, validation.request_timeout(timeout_s))
    return stream.response


async def _send_error(request: web.Request, stream: EventStream, err: ApiError) -> None:
    """An error after the stream started: Anthropic's `error` event."""
    request[RECORD].error_status = err.status
    _, kind = validation.anthropic_error(err)
    payload = messages.error_payload(kind, responses.error_message(err.detail))
    await stream.send(messages.event(payload))
