"""The one generation path every generating API runs through (chat, completions, Responses,
Anthropic Messages, Ollama): checks, admission, then the whole answer or a stream, with the API's
renderer as the only API-specific part.

1. Parse and translate (every 4xx before a byte is sent; large bodies off the event loop),
   then read the LoRA adapters the request runs under (api/common/adapters.py).
2. Submit every prompt; wait until each is tokenized and queued. --request-timeout-s counts
   from here, queue wait included: before the response starts its expiry is a 504 JSON error.
3. Collect (one JSON body) or stream (SSE; NDJSON for Ollama's API): each engine event goes
   through `Choices`, which reads tool calls and lines log-probabilities up, to the renderer.
4. Every ending — stop, length, tool call, the deadline, an engine error, the client gone —
   records usage and timing for the access log and the metrics; a stream that already
   answered 200 ends with the renderer's failure event and records the error status.
Leaving the generations' context (any exception, a cancelled handler) aborts the engine work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from edgeserve.api.common.call import Call, Framing, ModelNames, deadline_errors
from edgeserve.api.common.generating_api import (
    Choices,
    Event,
    GenerationApi,
    GenerationWork,
    Renderer,
    TokenUsage,
)
from edgeserve.api.reference.engine_errors import engine_error, request_timeout
from edgeserve.api.reference.request import check_can_generate
from edgeserve.engine.client import Generation
from edgeserve.engine.types import (
    MEDIA_MARKER,
    ChatPrompt,
    ChatTurn,
    GenerationRequest,
    PromptInfo,
)
from edgeserve.errors import ApiError, EngineError
from edgeserve.http.keys import SETTINGS
from edgeserve.http.request import call_for
from edgeserve.http.sse import EventStream
from edgeserve.log import PROMPTS

prompt_log = logging.getLogger(PROMPTS)


def generation_handler(
    api: GenerationApi[Any, Any],
    names: ModelNames | None = None,
    streams: Framing = "sse",
    unloads: Callable[[Any], bool] | None = None,
) -> Handler:
    """The aiohttp handler that serves `api` through the generation path (its model names
    read by `names` when given; streams framed as `streams` says; a body that `unloads` says
    only unloads its model runs nothing and loads nothing)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        call = await call_for(request, with_body=True, names=names, unloads=unloads)
        req = await call.off_loop(api.parse, call.body, call.limits)
        if call.client is not None:  # None: the body only unloads its model
            check_can_generate(call.engine.can_generate)
        work: GenerationWork = await call.checks(api.translate(req, call.limits))
        if work.requests:
            adapters = call.adapters()
            requests = tuple(replace(g, adapters=adapters) for g in work.requests)
            work = replace(work, requests=requests)
        return await _generate(request, call, api, req, work, streams)

    return handle


async def _generate(
    request: web.Request,
    call: Call,
    api: GenerationApi[Any, Any],
    req: Any,
    work: GenerationWork,
    streams: Framing,
) -> web.StreamResponse:
    settings = request.config_dict[SETTINGS]
    if settings.log_prompts:
        for generation in work.requests:
            _log_prompt(call, generation)
    started = time.perf_counter()
    deadline = asyncio.get_running_loop().time() + call.timeout_s
    limit = asyncio.timeout_at(deadline)
    usage = TokenUsage()
    submitted = False
    async with contextlib.AsyncExitStack() as stack:
        try:
            async with deadline_errors(limit, call.timeout_s):
                gens = [
                    await stack.enter_async_context(call.engine.generate(g)) for g in work.requests
                ]
                call.record.generations += gens
                async with limit:
                    prompts = await _submit(api, work, gens)
                    submitted = True
                    usage.prompt_tokens = sum(p.prompt_tokens for p in prompts)
                    renderer = await api.renderer(req, work, call, usage)
                    if not work.stream:
                        body = await _collect(work, gens, renderer, usage)
                        return web.Response(body=body, content_type="application/json")
            stream = EventStream(request, request.config_dict[SETTINGS].ping_interval_s, streams)
            return await _stream(stream, call, work, gens, renderer, usage, deadline)
        finally:
            if submitted:
                call.record.generated(
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.cached_tokens,
                    started,
                    usage.first_text_at,
                )


async def _submit(
    api: GenerationApi[Any, Any], work: GenerationWork, gens: Sequence[Generation]
) -> list[PromptInfo]:
    """Tokenize and queue every prompt; the API names the prompt the engine refused."""
    prompts = []
    for position, gen in enumerate(gens):
        try:
            prompts.append(await gen.submit())
        except EngineError as exc:
            raise api.admission_error(work, exc, position) from exc
    return prompts


async def _collect(
    work: GenerationWork, gens: Sequence[Generation], renderer: Renderer, usage: TokenUsage
) -> bytes:
    """The whole answer, as one body."""
    choices = Choices(renderer, work)
    async with contextlib.aclosing(_events(gens, work.n)) as events:
        async for event in events:
            usage.account(event, work.n)
            choices.collect(event)
    return renderer.body(choices.answers, usage)


async def _stream(
    stream: EventStream,
    call: Call,
    work: GenerationWork,
    gens: Sequence[Generation],
    renderer: Renderer,
    usage: TokenUsage,
    deadline: float,
) -> web.StreamResponse:
    """The answer as a stream of events; a client that goes away ends it (and leaving the
    generations' context then aborts the engine work)."""
    choices = Choices(renderer, work)
    async with stream:
        if not await stream.send_all(renderer.start()):
            return stream.response
        limit = asyncio.timeout_at(deadline)
        try:
            async with limit, contextlib.aclosing(_events(gens, work.n)) as events:
                async for event in events:
                    usage.account(event, work.n)
                    if not await stream.send_all(choices.stream(event, usage)):
                        return stream.response
        except EngineError as exc:
            await _fail(call, stream, renderer, engine_error(exc))
            return stream.response
        except TimeoutError:
            if not limit.expired():
                raise
            await _fail(call, stream, renderer, request_timeout(call.timeout_s))
            return stream.response
        await stream.send_all(renderer.end(usage))
    return stream.response


async def _fail(call: Call, stream: EventStream, renderer: Renderer, err: ApiError) -> None:
    """End a started stream with `err`, and record its status as the request's error."""
    call.record.error_status = err.status
    await stream.send_all(renderer.failure(err))


def _events(gens: Sequence[Generation], n: int) -> AsyncIterator[Event]:
    """The events of every generation as one stream in arrival order, choice indices offset
    by `position × n`; raises the first engine error. One generation's events are its own
    stream, with nothing in between."""
    return gens[0].events() if len(gens) == 1 else _merged(gens, n)


async def _merged(gens: Sequence[Generation], n: int) -> AsyncIterator[Event]:
    """Several generations' events, as `_events` says."""
    queue: asyncio.Queue[Event | EngineError | None] = asyncio.Queue()

    async def pump(gen: Generation, offset: int) -> None:
        try:
            async for event in gen.events():
                queue.put_nowait(replace(event, index=event.index + offset))
        except EngineError as exc:
            queue.put_nowait(exc)
        queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(gen, position * n)) for position, gen in enumerate(gens)]
    try:
        left = len(gens)
        while left:
            item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, EngineError):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _log_prompt(call: Call, work: GenerationRequest) -> None:
    """The conversation as the engine gets it, at debug level (only with --log-prompts)."""
    prompt = work.prompt
    if isinstance(prompt, ChatPrompt):
        turns = [{"role": turn.role, "content": _shown(turn)} for turn in prompt.messages]
        if prompt.system is not None:
            turns.insert(0, {"role": "system", "content": prompt.system})
        text = json.dumps(turns, ensure_ascii=False)
    elif isinstance(prompt, str):
        text = prompt
    else:
        text = json.dumps(list(prompt.ids))
    prompt_log.debug("prompt", extra={"request_id": call.record.request_id, "prompt": text})


def _shown(turn: ChatTurn) -> str:
    """A turn's text for the log, each media item as <image> or <audio> (not the marker)."""
    first, *rest = turn.content.split(MEDIA_MARKER)
    pieces = zip(turn.media, rest, strict=False)
    return first + "".join(f"<{media.kind}>{text}" for media, text in pieces)
