"""The port through which the API checks look up and download media URLs: the `MediaFetcher`
protocol that the HTTP layer implements (edgeserve/http/media_fetch.py) and `Limits` carries,
and the `FetchError` it raises."""

from __future__ import annotations

from typing import Protocol


class FetchError(Exception):
    """A media URL that could not be downloaded: `reason` completes "could not fetch X: …"
    (e.g. "HTTP 404"); `too_large` when the file is over the size limit (a 413)."""

    def __init__(self, reason: str, *, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_large = too_large


class MediaFetcher(Protocol):
    """Downloads http(s) media URLs under the server's address rules, and looks hosts up for
    the request's URL check as its downloads do."""

    async def fetch(self, url: str, limit: int) -> bytes:
        """The body of `url` (at most `limit` bytes), redirects followed; raises FetchError."""
        ...

    async def addresses(self, host: str) -> list[str]:
        """Every address `host` resolves to (not judged); OSError when it does not resolve."""
        ...
