"""http/media_fetch.py: media URLs downloaded from a local aiohttp server, under the address
rules (every address vetted, the connection pinned to the vetted ones, redirects re-checked,
numeric hosts refused), the size cap and the time limit, without cookies; the lookups it makes
for the request's check; and api/common/addresses.py's rule for which addresses are public.

The test server listens on 127.0.0.1; the fetchers here count only that address as public
(`ONLY_THE_TEST_SERVER`), so that "a private address" is any other. Host names are resolved by
`Names`, a resolver that knows only the names a test gives it: a name the system cannot
resolve proves the connection used the vetted answer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from edgeserve.api.common.addresses import is_public
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.fetcher import FetchError
from edgeserve.http.media_fetch import MAX_REDIRECTS, HttpMediaFetcher

IMAGE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
LIMIT = 4096
SERVER = ipaddress.ip_address("127.0.0.1")


def only_the_test_server(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return address == SERVER


class Names(AbstractResolver):
    """Answers for the names it was given (each answer a list of addresses, the next answer
    for each lookup, the last one repeated); counts lookups."""

    def __init__(self, **answers: list[list[str]]) -> None:
        self.answers = {name.replace("_", "-") + ".test": list(a) for name, a in answers.items()}
        self.lookups: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.lookups.append(host)
        answers = self.answers.get(host)
        if answers is None:
            raise OSError(f"unknown test name {host}")
        addresses = answers.pop(0) if len(answers) > 1 else answers[0]
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        return None


def answer(body: bytes = IMAGE, status: int = 200) -> Callable:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, status=status)

    return handler


async def until_gone(request: web.Request, seconds: float) -> None:
    """Wait `seconds`, or less once the client has closed the connection (a handler must
    not outlive its test's event loop, holding its socket)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end and request.transport and not request.transport.is_closing():
        await asyncio.sleep(0.02)


async def slow(request: web.Request) -> web.Response:
    await until_gone(request, 5)
    return web.Response(body=IMAGE)


async def announced_big(request: web.Request) -> web.StreamResponse:
    """Says it will send more than LIMIT bytes, sends a few, then stalls: only a fetcher that
    reads Content-Length refuses it at once."""
    response = web.StreamResponse()
    response.content_length = 10 * LIMIT
    await response.prepare(request)
    await response.write(b"x" * 16)
    await until_gone(request, 5)
    return response


async def endless(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(1000):
        await response.write(b"x" * 1024)
    return response


def redirect(location: str | Callable[[web.Request], str], status: int = 302) -> Callable:
    async def handler(request: web.Request) -> web.Response:
        target = location(request) if callable(location) else location
        return web.Response(status=status, headers={"Location": target})

    return handler


def hops(request: web.Request) -> str:
    left = int(request.match_info["left"])
    return "/image" if left == 0 else f"/hops/{left - 1}"


def to_numeric_host(request: web.Request) -> str:
    """The server's own /counted, on the numeric host the path names."""
    return f"http://{request.match_info['host']}:{request.url.port}/counted"


async def sets_a_cookie(request: web.Request) -> web.Response:
    response = web.Response(body=IMAGE)
    response.set_cookie("session", "client-a")
    return response


async def echoes_cookies(request: web.Request) -> web.Response:
    return web.Response(body=request.headers.get("Cookie", "").encode())


@pytest.fixture
def hits() -> list[str]:
    """The Host header of each request the test server's /counted got."""
    return []


@pytest.fixture
async def server(aiohttp_server, hits):
    async def counted(request: web.Request) -> web.Response:
        hits.append(request.host)
        return web.Response(body=IMAGE)

    app = web.Application()
    app.router.add_get("/counted", counted)
    app.router.add_get("/to/{host}", redirect(to_numeric_host))
    app.router.add_get("/set-cookie", sets_a_cookie)
    app.router.add_get("/cookies", echoes_cookies)
    app.router.add_get("/image", answer())
    app.router.add_get("/missing", answer(b"", 404))
    app.router.add_get("/big", answer(b"x" * (LIMIT + 1)))
    app.router.add_get("/announced-big", announced_big)
    app.router.add_get("/endless", endless)
    app.router.add_get("/slow", slow)
    app.router.add_get("/hops/{left}", redirect(hops, 301))
    app.router.add_get("/to-private-ip", redirect("http://10.0.0.1/x.png", 307))
    app.router.add_get("/to-metadata", redirect("http://169.254.169.254/latest/meta-data"))
    app.router.add_get("/to-private-name", redirect("http://evil.test/x.png", 303))
    app.router.add_get("/to-ftp", redirect("ftp://files.example/x.png"))
    app.router.add_get("/to-nowhere", answer(b"", 302))
    return await aiohttp_server(app)


@pytest.fixture
async def fetcher_for():
    """Fetchers opened for a test and closed after it."""
    opened: list[HttpMediaFetcher] = []

    async def make(
        resolver: AbstractResolver | None = None,
        *,
        timeout_s: float = 5.0,
        allowed: Callable | None = only_the_test_server,
        allow_private: bool = False,
    ) -> HttpMediaFetcher:
        fetcher = HttpMediaFetcher(
            timeout_s=timeout_s, allow_private=allow_private, resolver=resolver, allowed=allowed
        )
        await fetcher.start()
        opened.append(fetcher)
        return fetcher

    yield make
    for fetcher in opened:
        await fetcher.close()


def url(server, path: str, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{server.port}{path}"


async def refused(fetcher: HttpMediaFetcher, target: str) -> FetchError:
    with pytest.raises(FetchError) as caught:
        await fetcher.fetch(target, LIMIT)
    return caught.value


async def test_the_body_of_a_public_url(server, fetcher_for):
    fetcher = await fetcher_for()
    assert await fetcher.fetch(url(server, "/image"), LIMIT) == IMAGE


async def test_a_host_name_is_resolved_once_and_the_connection_uses_that_answer(
    server, fetcher_for
):
    names = Names(media=[["127.0.0.1"]])
    fetcher = await fetcher_for(names)
    assert await fetcher.fetch(url(server, "/image", "media.test"), LIMIT) == IMAGE
    assert names.lookups == ["media.test"]  # a name only the vetting resolver knows


@pytest.mark.parametrize(
    "answers",
    [
        [["10.0.0.1"]],
        [["127.0.0.1", "10.0.0.1"]],  # one bad address refuses the host
        [["::ffff:10.0.0.1"]],
    ],
    ids=["private", "mixed", "mapped"],
)
async def test_a_name_with_a_private_address_is_refused_before_connecting(
    server, fetcher_for, answers
):
    fetcher = await fetcher_for(Names(media=answers))
    error = await refused(fetcher, url(server, "/image", "media.test"))
    assert "is a private, loopback, link-local or reserved address" in error.reason
    assert "--allow-private-media-urls" in error.reason and not error.too_large


# Hosts that end in a number: aiohttp before 3.14.1 connects to them without asking the
# resolver (2130706433, 127.1, 0177.0.0.1 and 0 reach this server), and 0x7f.1 resolves to it.
NUMERIC_HOSTS = ["2130706433", "127.1", "0177.0.0.1", "0x7f.1", "0", "127.0.0.1."]


@pytest.mark.parametrize("via", ["first URL", "redirect"])
@pytest.mark.parametrize("host", NUMERIC_HOSTS)
async def test_a_numeric_host_is_refused_and_never_contacted(server, fetcher_for, hits, host, via):
    # The rule here takes 127.0.0.1 as public: only the host's form can refuse it.
    fetcher = await fetcher_for(Names())
    target = url(server, "/counted", host) if via == "first URL" else url(server, f"/to/{host}")
    assert (await refused(fetcher, target)).reason == Detail.NUMERIC_HOST.format(host=host)
    assert hits == []
    assert await fetcher.fetch(url(server, "/counted"), LIMIT) == IMAGE  # the canonical form
    assert hits == [f"127.0.0.1:{server.port}"]


@pytest.mark.parametrize(
    "address",
    [
        "::127.0.0.1",  # IPv4-compatible
        "::ffff:0:7f00:1",  # IPv4-translated
        "64:ff9b::7f00:1",  # NAT64
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b:1::a00:1",  # local-use NAT64
        "2002:7f00:1::1",  # 6to4
        "2002:a00:1::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "fec0::1",  # site-local
    ],
)
async def test_an_ipv6_answer_that_carries_a_private_ipv4_address_is_refused(
    server, fetcher_for, hits, address
):
    fetcher = await fetcher_for(Names(media=[[address]]), allowed=None)  # the server's rule
    error = await refused(fetcher, url(server, "/counted", "media.test"))
    shown = ipaddress.ip_address(address)  # as the reason writes it (::7f00:1)
    assert error.reason.startswith(f"media.test ({shown}) is a private")
    assert hits == []


async def test_a_cookie_one_download_received_is_not_sent_on_the_next(server, fetcher_for):
    # A host name: aiohttp's cookie jar keeps no cookies of IP-literal hosts anyway.
    fetcher = await fetcher_for(Names(media=[["127.0.0.1"]]))
    assert await fetcher.fetch(url(server, "/set-cookie", "media.test"), LIMIT) == IMAGE
    assert await fetcher.fetch(url(server, "/cookies", "media.test"), LIMIT) == b""


async def test_addresses_are_the_downloads_resolvers_answer_unjudged(fetcher_for):
    names = Names(media=[["10.0.0.1", "::1"]])
    fetcher = await fetcher_for(names)
    assert await fetcher.addresses("media.test") == ["10.0.0.1", "::1"]
    # From a worker thread's loop (a large request's checks), on the session's loop.
    other_loop = await asyncio.to_thread(asyncio.run, fetcher.addresses("media.test"))
    assert other_loop == ["10.0.0.1", "::1"]
    assert names.lookups == ["media.test"] * 2
    with pytest.raises(OSError):
        await fetcher.addresses("gone.test")


class Stalls(AbstractResolver):
    """A resolver that never answers."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        return None


async def test_a_lookup_has_the_fetch_time_limit(fetcher_for):
    fetcher = await fetcher_for(Stalls(), timeout_s=0.2)
    lookup = asyncio.ensure_future(fetcher.addresses("media.test"))
    await asyncio.wait([lookup], timeout=10)  # a guard: a lookup without the limit never ends
    finished = lookup.done()
    lookup.cancel()
    assert finished and isinstance(lookup.exception(), TimeoutError)


async def test_dns_rebinding_after_the_check_cannot_reach_a_private_address(server, fetcher_for):
    # The request's check (check_remote_url) saw the public answer; the name now points inside.
    names = Names(media=[["127.0.0.1"], ["10.0.0.1"]])
    await names.resolve("media.test")
    fetcher = await fetcher_for(names)
    error = await refused(fetcher, url(server, "/image", "media.test"))
    assert error.reason.startswith("media.test (10.0.0.1) is a private")


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/to-private-ip", "10.0.0.1 is a private"),
        ("/to-metadata", "169.254.169.254 is a private"),
        ("/to-private-name", "evil.test (10.0.0.1) is a private"),
    ],
)
async def test_a_redirect_to_a_private_address_is_refused(server, fetcher_for, path, says):
    fetcher = await fetcher_for(Names(evil=[["10.0.0.1"]]))
    assert (await refused(fetcher, url(server, path))).reason.startswith(says)


async def test_redirects_are_followed_up_to_the_limit(server, fetcher_for):
    fetcher = await fetcher_for()
    path = f"/hops/{MAX_REDIRECTS - 1}"  # MAX_REDIRECTS redirects in all
    assert await fetcher.fetch(url(server, path), LIMIT) == IMAGE
    error = await refused(fetcher, url(server, f"/hops/{MAX_REDIRECTS}"))
    assert error.reason == f"more than {MAX_REDIRECTS} redirects"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/missing", "HTTP 404"),
        ("/to-nowhere", "HTTP 302 without a Location"),
        ("/to-ftp", "it redirects to 'ftp://files.example/x.png', which is not an http(s) URL"),
    ],
)
async def test_failures_say_why(server, fetcher_for, path, reason):
    fetcher = await fetcher_for()
    assert (await refused(fetcher, url(server, path))).reason == reason


async def test_a_body_over_the_limit_is_refused(server, fetcher_for):
    fetcher = await fetcher_for()
    error = await refused(fetcher, url(server, "/big"))
    assert error.too_large and error.reason == f"larger than {LIMIT} bytes"
    assert await fetcher.fetch(url(server, "/big"), LIMIT + 1) == b"x" * (LIMIT + 1)


async def test_a_content_length_over_the_limit_is_refused_before_reading(server, fetcher_for):
    fetcher = await fetcher_for(timeout_s=2.0)
    assert (await refused(fetcher, url(server, "/announced-big"))).too_large


async def test_a_stream_is_cut_once_it_passes_the_limit(server, fetcher_for):
    fetcher = await fetcher_for()
    error = await refused(fetcher, url(server, "/endless"))
    assert error.too_large


async def test_the_time_limit(server, fetcher_for):
    fetcher = await fetcher_for(timeout_s=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await refused(fetcher, url(server, "/slow"))).reason == "timed out after 0.2 s"
    assert loop.time() - started < 2


async def test_a_closed_port(fetcher_for, unused_tcp_port):
    fetcher = await fetcher_for()
    error = await refused(fetcher, f"http://127.0.0.1:{unused_tcp_port}/x.png")
    assert error.reason == f"cannot connect to 127.0.0.1 port {unused_tcp_port}"


async def test_an_unresolvable_name(server, fetcher_for):
    fetcher = await fetcher_for(Names())
    error = await refused(fetcher, url(server, "/image", "gone.test"))
    assert error.reason == "cannot resolve the host name gone.test"


async def test_private_addresses_need_the_switch(server, fetcher_for):
    strict = await fetcher_for(allowed=None)
    assert (await refused(strict, url(server, "/image"))).reason.startswith("127.0.0.1 is a")
    relaxed = await fetcher_for(allowed=None, allow_private=True)
    assert await relaxed.fetch(url(server, "/image"), LIMIT) == IMAGE


async def test_a_fetch_from_another_event_loop_runs_on_the_sessions_loop(server, fetcher_for):
    # A large request's checks run on a worker thread's own event loop (Call.checks).
    fetcher = await fetcher_for()
    target = url(server, "/image")
    body = await asyncio.to_thread(asyncio.run, fetcher.fetch(target, LIMIT))
    assert body == IMAGE


async def test_a_fetcher_not_started_refuses():
    fetcher = HttpMediaFetcher(timeout_s=1)
    with pytest.raises(FetchError):
        await fetcher.fetch("http://example.com/x.png", LIMIT)


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.215.14", True),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("ff02::1", False),
        ("::1", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:93.184.215.14", True),
        # IPv6 forms that carry an IPv4 address are judged as that address
        ("::127.0.0.1", False),
        ("::", False),
        ("::ffff:0:7f00:1", False),
        ("::ffff:0:5db8:d70e", True),
        ("64:ff9b::7f00:1", False),
        ("64:ff9b::a00:1", False),
        ("64:ff9b::5db8:d70e", True),
        ("2002:7f00:1::1", False),
        ("2002:a9fe:a9fe::1", False),
        ("2002:5db8:d70e::1", True),
        # never public, whatever they carry
        ("64:ff9b:1::5db8:d70e", False),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),
        ("fec0::1", False),
        ("224.0.0.1", False),
    ],
)
def test_public_addresses(address, public):
    assert is_public(ipaddress.ip_address(address)) is public
