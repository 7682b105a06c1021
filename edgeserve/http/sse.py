"""Server-sent events on aiohttp's StreamResponse: headers, one write per event, pings; or
newline-delimited JSON (Ollama's streams), framed the same way without pings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from types import TracebackType

from aiohttp import web

from edgeserve.api.common.call import Framing
from edgeserve.api.common.openai_render import ping_comment
from edgeserve.http.middlewares import prepare_stream_headers

log = logging.getLogger("edgeserve.http")

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-store",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}
"""As sse-starlette sends them; `Connection` becomes `close` when the client asked to close
(as uvicorn rewrites it), since aiohttp then closes the connection after the stream."""


NDJSON_TYPE = "application/x-ndjson"
"""Ollama's stream type: one JSON object per line."""


class EventStream:
    """An open SSE (or NDJSON) response. Every event, and every ping, is one write into the
    transport before any await (no compression, no hook ahead of it), so a ping falls between
    two events and never splits one.

    A client that went away makes `send` return False instead of raising; the caller then
    stops producing (and the engine request is aborted by its context manager). An NDJSON
    stream has no pings: every line its reader gets must be a JSON object.
    """

    def __init__(
        self,
        request: web.Request,
        ping_interval: float,
        framing: Framing = "sse",
    ) -> None:
        self._request = request
        headers = dict(SSE_HEADERS)
        if framing == "ndjson":
            headers["Content-Type"] = NDJSON_TYPE
            ping_interval = 0.0
        if not request.keep_alive:
            headers["Connection"] = "close"
        self._response = web.StreamResponse(status=200, headers=headers)
        self._interval = ping_interval
        self._pinger: asyncio.Task[None] | None = None
        self.open = True

    async def __aenter__(self) -> EventStream:
        prepare_stream_headers(self._request, self._response)
        await self._response.prepare(self._request)
        if self._interval > 0:
            self._pinger = asyncio.create_task(self._ping_forever())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pinger
        if self.open and exc_type is None:
            with contextlib.suppress(ConnectionResetError):
                await self._response.write_eof()

    @property
    def response(self) -> web.StreamResponse:
        """The prepared response, to return from the handler."""
        return self._response

    async def send(self, data: bytes) -> bool:
        """Write one event; False when the client has gone away."""
        if not self.open:
            return False
        try:
            await self._response.write(data)
        except ConnectionResetError:
            log.debug("client went away mid-stream")
            self.open = False
        return self.open

    async def send_all(self, events: list[bytes]) -> bool:
        """Write each event in turn; False as soon as the client has gone away."""
        for data in events:
            if not await self.send(data):
                return False
        return self.open

    async def _ping_forever(self) -> None:
        while self.open:
            await asyncio.sleep(self._interval)
            await self.send(ping_comment(datetime.now(UTC)))
