"""Downloading media URLs (api/reference/fetcher.py's `MediaFetcher`) with aiohttp, so that a
client cannot make the server reach its own network (SSRF).

- http and https only; redirects are followed here (at most MAX_REDIRECTS), each target
  checked as the first URL is;
- every address a host name resolves to must be public (`is_public`, the rule the request's
  check applies too: api/common/addresses.py) unless --allow-private-media-urls, and the
  connection goes to exactly the addresses that were checked: the connector's resolver is
  `VettedResolver`, so no second lookup happens between the check and the connect (DNS
  rebinding); an IP-literal host, which the connector does not resolve, is checked before the
  request, and a host that ends in a number but is not a canonical address (2130706433, 127.1,
  0x7f.1) is refused whatever the rule;
- the request's check looks hosts up through `addresses`, with the downloads' own resolver;
- the body may not exceed the size limit (a Content-Length over it is refused before reading,
  a longer stream as soon as it passes it), and the whole download, redirects included, must
  end within --media-fetch-timeout-s (a lookup too);
- no proxies from the environment, no decompression (the bytes are the file's), no cookies
  (one client's download never carries a cookie another's received).

Every failure is a `FetchError` whose reason completes "could not fetch X's image: …".
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver
from yarl import URL

import edgeserve
from edgeserve.api.common.addresses import IPAddress, NumericHost, is_public, literal_address
from edgeserve.api.reference.fetcher import FetchError

MAX_REDIRECTS = 5
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024

AddressRule = Callable[[IPAddress], bool]
T = TypeVar("T")


def _refused(host: str, address: IPAddress) -> FetchError:
    shown = host if host == str(address) else f"{host} ({address})"
    return FetchError(
        f"{shown} is a private, loopback, link-local or reserved address, which this server "
        "does not fetch from (see --allow-private-media-urls)"
    )


class VettedResolver(AbstractResolver):
    """Resolves through `base` and hands the connector only addresses `allowed` accepts: a
    host with any other address is refused (FetchError) before anything connects."""

    def __init__(self, base: AbstractResolver, allowed: AddressRule) -> None:
        self._base = base
        self._allowed = allowed

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._base.resolve(host, port, family)
        for result in results:
            address = ipaddress.ip_address(result["host"])
            if not self._allowed(address):
                raise _refused(host, address)
        return results

    async def close(self) -> None:
        await self._base.close()


class HttpMediaFetcher:
    """The server's `MediaFetcher`: one aiohttp session, opened by `start` on the app's event
    loop and closed by `close`. `fetch` and `addresses` may be awaited on any loop (a large
    request's checks run on a worker thread's loop): the work itself always runs on the
    session's loop (whose executor, not the worker loop's, holds a lookup's thread).

    `resolver` (default: getaddrinfo on a thread) and `allowed` (default: public addresses,
    any with `allow_private`) exist for tests."""

    def __init__(
        self,
        *,
        timeout_s: float,
        allow_private: bool = False,
        resolver: AbstractResolver | None = None,
        allowed: AddressRule | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._allowed = allowed or (lambda address: allow_private or is_public(address))
        self._resolver = resolver
        self._session: aiohttp.ClientSession | None = None
        self._lookups: AbstractResolver | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Open the session on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._lookups = self._resolver or ThreadedResolver()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                resolver=VettedResolver(self._lookups, self._allowed), use_dns_cache=False
            ),
            headers={
                "User-Agent": f"edgeserve/{edgeserve.__version__}",
                "Accept-Encoding": "identity",
            },
            auto_decompress=False,
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        """Close the session (and its connections)."""
        if self._session is not None:
            await self._session.close()
            self._session = self._lookups = None

    async def fetch(self, url: str, limit: int) -> bytes:
        """The body of `url`, at most `limit` bytes; raises FetchError."""
        if self._session is None:
            raise FetchError("the server is not serving")
        return await self._on_session_loop(self._fetch(self._session, url, limit))

    async def addresses(self, host: str) -> list[str]:
        """Every address `host` resolves to, looked up as a download looks it up and not
        judged (the request's check judges them); OSError when it does not resolve within
        --media-fetch-timeout-s."""
        if self._lookups is None:
            raise FetchError("the server is not serving")
        return await self._on_session_loop(self._addresses(self._lookups, host))

    async def _on_session_loop(self, work: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        if asyncio.get_running_loop() is self._loop:
            return await work
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def _addresses(self, resolver: AbstractResolver, host: str) -> list[str]:
        async with asyncio.timeout(self._timeout_s):
            results = await resolver.resolve(host, 0, socket.AF_UNSPEC)
        return [result["host"] for result in results]

    async def _fetch(self, session: aiohttp.ClientSession, url: str, limit: int) -> bytes:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._follow(session, URL(url), limit)
        except TimeoutError:
            raise FetchError(f"timed out after {self._timeout_s:g} s") from None
        except aiohttp.ClientConnectorDNSError as exc:
            raise FetchError(f"cannot resolve the host name {exc.host}") from None
        except aiohttp.ClientConnectorError as exc:
            raise FetchError(f"cannot connect to {exc.host} port {exc.port}") from None
        except aiohttp.ClientError as exc:
            raise FetchError(f"the download failed ({exc})") from None
        except ValueError as exc:
            raise FetchError(f"the URL is not valid ({exc})") from None

    async def _follow(self, session: aiohttp.ClientSession, url: URL, limit: int) -> bytes:
        """GET `url`, following redirects (each target checked), and read the body."""
        for _ in range(MAX_REDIRECTS + 1):
            self._check_target(url)
            async with session.get(url, allow_redirects=False) as response:
                if response.status in _REDIRECTS:
                    location = response.headers.get("Location")
                    if not location:
                        raise FetchError(f"HTTP {response.status} without a Location")
                    url = url.join(URL(location))
                    continue
                if not 200 <= response.status < 300:
                    raise FetchError(f"HTTP {response.status}")
                return await _read_body(response, limit)
        raise FetchError(f"more than {MAX_REDIRECTS} redirects")

    def _check_target(self, url: URL) -> None:
        """An http(s) URL with a host; an IP-literal host must be canonical and allowed
        (names are checked by the resolver)."""
        if url.scheme not in ("http", "https"):
            raise FetchError(f"it redirects to {str(url)!r}, which is not an http(s) URL")
        host = url.raw_host
        if not host:
            raise FetchError("a URL without a host")
        try:
            address = literal_address(host)
        except NumericHost as exc:
            raise FetchError(str(exc)) from None
        if address is not None and not self._allowed(address):
            raise _refused(host, address)


async def _read_body(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, refused (FetchError too_large) as soon as it is known to exceed `limit`."""
    too_large = FetchError(f"larger than {limit} bytes", too_large=True)
    if response.content_length is not None and response.content_length > limit:
        raise too_large
    body = bytearray()
    async for chunk in response.content.iter_chunked(_CHUNK):
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)
