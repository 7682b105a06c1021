"""Steps every API handler shares: read, decode, authenticate."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from edgeserve import validation
from edgeserve.errors import EngineError
from edgeserve.http.keys import SETTINGS


async def authenticated_body(request: web.Request) -> Any:
    """Read and JSON-decode the body, then check the API key (the reference's order)."""
    raw = await request.read()
    body = validation.decode_json_body(raw, request.headers.get("Content-Type"))
    validation.check_api_key(request.headers.get("Authorization"), request.app[SETTINGS].api_keys)
    return body


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
