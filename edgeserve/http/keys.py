"""Typed application and request keys (no string keys, no module globals)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aiohttp import web

from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient, Generation
from edgeserve.metrics import Metrics
from edgeserve.validation import Limits


@dataclass
class RequestRecord:
    """What a handler learned about its request, for the access log line and the metrics.

    `error_status` is set when a stream that had already answered 200 ended with an in-band
    error event (e.g. 504 past --request-timeout-s). `generations` are the request's engine
    generations (their speculation counts are read when the line is written).
    """

    request_id: str
    prompt_tokens: int | None = None
    cached_tokens: int = 0
    completion_tokens: int | None = None
    ttft_s: float | None = None
    gen_s: float | None = None
    error_status: int | None = None
    generations: list[Generation] = field(default_factory=list)

    def generated(
        self, prompt: int, completion: int, cached: int, started: float, first: float | None
    ) -> None:
        """Note a finished generation: token counts, and (when any text came, at `first`)
        time to first token from `started` and the generation time until now."""
        self.prompt_tokens = prompt
        self.completion_tokens = completion
        self.cached_tokens = cached
        if first is not None:
            self.ttft_s = first - started
            self.gen_s = time.perf_counter() - first


SETTINGS = web.AppKey("edgeserve.settings", Settings)
ENGINE = web.AppKey("edgeserve.engine", EngineClient)
LIMITS = web.AppKey("edgeserve.limits", Limits)
METRICS = web.AppKey("edgeserve.metrics", Metrics)
KNOWN_PATHS = web.AppKey("edgeserve.known_paths", frozenset)
ANTHROPIC_PATHS = web.AppKey("edgeserve.anthropic_paths", frozenset)
RECORD = web.RequestKey("edgeserve.record", RequestRecord)
