"""Steps every API handler shares: read, decode, authenticate."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from edgeserve import validation
from edgeserve.http.keys import SETTINGS


async def authenticated_body(request: web.Request) -> Any:
    """Read and JSON-decode the body, then check the API key (the reference's order)."""
    raw = await request.read()
    body = validation.decode_json_body(raw, request.headers.get("Content-Type"))
    validation.check_api_key(request.headers.get("Authorization"), request.app[SETTINGS].api_keys)
    return body
