"""Typed application and request keys (no string keys, no module globals)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.validation import Limits


@dataclass
class RequestRecord:
    """What a handler learned about its request, for the access log line."""

    request_id: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    gen_s: float | None = None


SETTINGS = web.AppKey("edgeserve.settings", Settings)
ENGINE = web.AppKey("edgeserve.engine", EngineClient)
LIMITS = web.AppKey("edgeserve.limits", Limits)
KNOWN_PATHS = web.AppKey("edgeserve.known_paths", frozenset)
RECORD = web.RequestKey("edgeserve.record", RequestRecord)
