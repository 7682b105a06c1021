"""Steps every API handler shares: read, decode, authenticate, keep heavy parsing off the loop,
log the prompt, end a started stream on a failure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from edgeserve import responses, validation
from edgeserve.engine.types import ChatPrompt, GenerationRequest
from edgeserve.errors import EngineError
from edgeserve.http.keys import ENGINE, LIMITS, RECORD, SETTINGS
from edgeserve.log import PROMPTS

T = TypeVar("T")
R = TypeVar("R")
W = TypeVar("W")

prompt_log = logging.getLogger(PROMPTS)

# Bodies larger than this are decoded, validated and checked on a worker thread: a request of
# 100,000 chat messages takes over a second of CPU to parse and check, which on the event loop
# would stall every running stream for as long.
LARGE_BODY_BYTES = 256 * 1024


async def authenticated_body(request: web.Request) -> tuple[Any, bool]:
    """Read and JSON-decode the body, then check the API key (the reference's order).
    Returns the body and whether it is large (see `off_loop`)."""
    raw = await request.read()
    large = len(raw) > LARGE_BODY_BYTES
    body = await off_loop(
        large, validation.decode_json_body, raw, request.headers.get("Content-Type")
    )
    check_key(request)
    return body, large


def check_key(request: web.Request) -> None:
    """401 unless the request carries a configured API key (as a bearer token or in
    Anthropic's `x-api-key` header)."""
    validation.check_api_key(
        request.headers.get("Authorization"),
        request.app[SETTINGS].api_keys,
        request.headers.get("x-api-key"),
    )


async def off_loop(large: bool, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, on a worker thread when the request body is large, else right here."""
    if large:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


@contextlib.asynccontextmanager
async def engine_errors(limit: asyncio.Timeout, timeout_s: float) -> AsyncIterator[None]:
    """Turn engine exceptions into their client errors, and the expiry of `limit` (the
    request's deadline, --request-timeout-s) into 504. Put it outside whatever holds engine
    work, so that leaving that has already cancelled the work."""
    try:
        yield
    except EngineError as exc:
        raise validation.engine_error(exc) from exc
    except TimeoutError:
        if not limit.expired():
            raise
        raise validation.request_timeout(timeout_s) from None


def stream_failure(request: web.Request, exc: EngineError | TimeoutError) -> bytes:
    """The event that ends a started stream on an engine error or past the request's deadline
    (--request-timeout-s); its status is recorded as the request's error."""
    if isinstance(exc, EngineError):
        err = validation.engine_error(exc)
    else:
        err = validation.request_timeout(request.app[SETTINGS].request_timeout_s)
    request[RECORD].error_status = err.status
    return responses.stream_error_event(err.status, err.detail)


def log_prompt(request: web.Request, work: GenerationRequest) -> None:
    """The conversation as the engine gets it, at debug level (only with --log-prompts)."""
    prompt = work.prompt
    if isinstance(prompt, ChatPrompt):
        turns = [{"role": turn.role, "content": turn.content} for turn in prompt.messages]
        if prompt.system is not None:
            turns.insert(0, {"role": "system", "content": prompt.system})
        text = json.dumps(turns, ensure_ascii=False)
    else:
        text = prompt
    prompt_log.debug("prompt", extra={"request_id": request[RECORD].request_id, "prompt": text})


async def checked_request(
    request: web.Request,
    parse: Callable[[Any], R],
    prepare: Callable[[R, validation.Limits], Awaitable[W]],
) -> tuple[R, W]:
    """A generation request authenticated, parsed and checked by `parse` and `prepare` (every
    4xx before a byte is sent); bodies over 256 KiB are handled off the event loop."""
    body, large = await authenticated_body(request)
    req = await off_loop(large, parse, body)
    validation.check_can_generate(request.app[ENGINE].can_generate)
    checks = prepare(req, request.app[LIMITS])
    work = await (off_loop(large, asyncio.run, checks) if large else checks)
    return req, work
