"""What the HTTP layer hands an API's endpoint, and what the endpoint leaves for the access
log: no aiohttp here, so an API package never sees the web framework.

An endpoint is either a `Unary` function (one engine call, one JSON answer) or a
`GenerationApi` (see generating_api.py), mounted by a `Route`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from edgeserve.api.common.adapters import chosen_adapters
from edgeserve.api.reference.engine_errors import engine_error, request_timeout
from edgeserve.api.reference.limits import Limits
from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import AdapterSet
from edgeserve.errors import EngineError

if TYPE_CHECKING:
    from edgeserve.api.common.generating_api import GenerationApi
    from edgeserve.catalogue.status import Models
    from edgeserve.engine.client import Generation

T = TypeVar("T")


@dataclass
class RequestRecord:
    """What an endpoint learned about its request, for the access log line and the metrics.

    `error_status` is set when a stream that had already answered 200 ended with an in-band
    error event (e.g. 504 past --request-timeout-s). `generations` are the request's engine
    generations (their speculation counts are read when the line is written).
    """

    request_id: str
    started: float = field(default_factory=time.perf_counter)  # when the request came in
    load_s: float = 0.0  # how long it waited for its model to load
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


@dataclass
class Call:
    """One authenticated request as an endpoint sees it: the decoded body (None for GET), the
    engine, the limits and settings it answers under, and its access-log record. `large`
    bodies (see http/request.py) are parsed and answered off the event loop (`off_loop`)."""

    body: Any
    client: EngineClient | None  # the model the request runs on (None: a route of no model)
    limits: Limits
    model_name: str
    timeout_s: float
    record: RequestRecord
    large: bool = False
    allow_runtime_lora: bool = False  # --allow-runtime-lora: the adapter endpoints answer
    models: Models | None = None  # every model of the server (GET /v1/models lists them)
    query: Mapping[str, str] = field(default_factory=dict)  # the URL's query parameters

    @property
    def engine(self) -> EngineClient:
        """The engine of the model the request runs on."""
        assert self.client is not None, "a route that needs a model was mounted without one"
        return self.client

    def adapters(self) -> AdapterSet:
        """The LoRA adapters the body asks the model to run under (see adapters.py; 400 or
        404 when it names them wrongly); call it after the API's own checks."""
        return chosen_adapters(self.body, self.engine.adapters)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`, on a worker thread when the body is large, else right here."""
        if self.large:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def checks(self, checks: Coroutine[Any, Any, T]) -> T:
        """Await an async check (one that may convert a schema, or look up and fetch media)
        under a deadline of its own (--request-timeout-s: 504 past it), on a worker thread's
        event loop when the body is large."""
        bounded = _within(checks, self.timeout_s)
        if self.large:
            return await asyncio.to_thread(asyncio.run, bounded)
        return await bounded

    @contextlib.asynccontextmanager
    async def engine_work(self) -> AsyncIterator[None]:
        """Engine work under the request's deadline (--request-timeout-s): EngineError becomes
        its client error and the deadline's expiry a 504; leaving early cancels the work."""
        limit = asyncio.timeout(self.timeout_s)
        async with deadline_errors(limit, self.timeout_s), limit:
            yield


async def _within(work: Awaitable[T], timeout_s: float) -> T:
    limit = asyncio.timeout(timeout_s)
    async with deadline_errors(limit, timeout_s), limit:
        return await work


@contextlib.asynccontextmanager
async def deadline_errors(limit: asyncio.Timeout, timeout_s: float) -> AsyncIterator[None]:
    """Turn engine exceptions into their client errors, and the expiry of `limit` into 504.
    Put it outside whatever holds engine work, so that leaving that has already cancelled
    the work."""
    try:
        yield
    except EngineError as exc:
        raise engine_error(exc) from exc
    except TimeoutError:
        if not limit.expired():
            raise
        raise request_timeout(timeout_s) from None


Unary = Callable[[Call], Awaitable[bytes]]
"""An endpoint that answers one JSON body."""

Framing = Literal["sse", "ndjson"]
"""How a generating API's stream is framed: server-sent events, or one JSON object per line."""

ModelNames = Callable[[Any, Collection[str]], str]
"""How an API reads the model its body names, given every name the server serves: the name to
hold (an ApiError when it names none). Without one, the name is taken as given, and with one
model any name is that model."""


@dataclass(frozen=True)
class Route:
    """One endpoint of an API: a method, a path, and either a `Unary` function or a
    `GenerationApi`."""

    method: Literal["GET", "POST", "DELETE"]
    path: str
    endpoint: Unary | GenerationApi[Any, Any]
    uses_model: bool = True  # runs on the model the request names (False: on none)
    names: ModelNames | None = None  # the API's own reading of model names
    # A body that only unloads its model (Ollama's keep_alive 0 with nothing to run): the
    # model is not loaded for it, and the request holds none.
    unloads: Callable[[Any], bool] | None = None
    streams: Framing = "sse"
