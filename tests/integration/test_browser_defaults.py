"""Safe browser defaults over HTTP (README divergence 18): CORS grants only loopback pages and
the listed origins, and a Host header naming a foreign host is 403 (DNS rebinding)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from edgeserve.api.reference.detail import Detail
from edgeserve.config import CORS_ANY, CORS_REFERENCE
from edgeserve.engine.client import EngineClient
from edgeserve.http.app import create_app
from edgeserve.http.browser import host_name

MODELS = "/v1/models"
CHAT = "/v1/chat/completions"
FOREIGN = "https://evil.example"
APP = "https://app.example"
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


async def simple(client: Any, origin: str) -> aiohttp.ClientResponse:
    async with client.get(MODELS, headers={"Origin": origin}) as resp:
        assert resp.status == 200
        assert resp.headers["Vary"] == "Origin"
        return resp


async def preflight(client: Any, origin: str) -> tuple[int, str, Any]:
    async with client.options(CHAT, headers={**PREFLIGHT, "Origin": origin}) as resp:
        return resp.status, await resp.text(), resp.headers


def granted(headers: Any, origin: str, credentials: bool = True) -> bool:
    return headers.get("Access-Control-Allow-Origin") == origin and headers.get(
        "Access-Control-Allow-Credentials"
    ) == ("true" if credentials else None)


def refused(status: int, text: str, headers: Any) -> bool:
    return (status, text) == (400, "Disallowed CORS origin") and (
        "Access-Control-Allow-Origin" not in headers
    )


@pytest.mark.parametrize(
    "origin", ["http://localhost:5173", "http://127.0.0.1:3000", "https://[::1]:8443"]
)
async def test_loopback_pages_are_granted_by_default(client, origin):
    assert granted((await simple(client, origin)).headers, origin)
    status, text, headers = await preflight(client, origin)
    assert (status, text) == (200, "OK")
    assert granted(headers, origin)
    assert headers["Access-Control-Allow-Headers"] == PREFLIGHT["Access-Control-Request-Headers"]


@pytest.mark.parametrize("origin", [FOREIGN, "http://localhost.evil.example", "null"])
async def test_foreign_pages_get_no_grant_by_default(client, origin):
    headers = (await simple(client, origin)).headers
    assert "Access-Control-Allow-Origin" not in headers
    assert "Access-Control-Allow-Credentials" not in headers
    assert refused(*await preflight(client, origin))


async def test_listed_origins_replace_the_default(make_client):
    client = await make_client(cors_origins=(APP,))
    assert granted((await simple(client, APP)).headers, APP)
    status, _, headers = await preflight(client, APP)
    assert status == 200
    assert granted(headers, APP)
    assert refused(*await preflight(client, FOREIGN))
    assert refused(*await preflight(client, "http://localhost:5173"))


async def test_listed_origins_with_local(make_client):
    client = await make_client(cors_origins=("local", APP))
    for origin in (APP, "http://localhost:5173"):
        assert granted((await simple(client, origin)).headers, origin)
    assert refused(*await preflight(client, FOREIGN))


async def test_any_origin_without_credentials(make_client):
    client = await make_client(cors_origins=(CORS_ANY,))
    assert granted((await simple(client, FOREIGN)).headers, "*", credentials=False)
    status, _, headers = await preflight(client, FOREIGN)
    assert status == 200
    assert granted(headers, "*", credentials=False)


async def test_reference_echoes_every_origin_with_credentials(make_client):
    client = await make_client(cors_origins=(CORS_REFERENCE,))
    assert granted((await simple(client, FOREIGN)).headers, FOREIGN)
    status, _, headers = await preflight(client, FOREIGN)
    assert status == 200
    assert granted(headers, FOREIGN)


async def test_no_cors_at_all(make_client):
    client = await make_client(cors_origins=())
    assert "Access-Control-Allow-Origin" not in (await simple(client, "http://localhost")).headers
    assert refused(*await preflight(client, "http://localhost"))


@pytest.mark.parametrize(("origin", "grant"), [("http://localhost:5173", True), (FOREIGN, False)])
async def test_streamed_answers_carry_the_same_grant(client, origin, grant):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with client.post(CHAT, json={**body, "stream": True}, headers={"Origin": origin}) as resp:
        assert resp.status == 200
        await resp.read()
        assert resp.headers.get("Access-Control-Allow-Origin") == (origin if grant else None)


# ---- Host ------------------------------------------------------------------------------------


def host_error(host: str) -> str:
    return Detail.HOST_NOT_ALLOWED.format(host=host_name(host))


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8000", "127.0.0.1", "[::1]:9", "LOCALHOST."]
)
async def test_loopback_hosts_are_served(client, host):
    async with client.get(MODELS, headers={"Host": host}) as resp:
        assert resp.status == 200


@pytest.mark.parametrize("host", ["evil.example:8000", "localhost.evil.example", "192.168.1.5"])
async def test_a_foreign_host_is_403(client, host):
    async with client.get(MODELS, headers={"Host": host}) as resp:
        assert resp.status == 403
        assert resp.headers["Content-Type"] == "application/json"
        assert "X-Request-Id" in resp.headers
        assert await resp.json() == {"detail": host_error(host), "message": host_error(host)}
    async with client.get("/health", headers={"Host": host}) as resp:
        assert resp.status == 403


async def test_a_foreign_host_on_the_anthropic_api_gets_its_shape(client):
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    async with client.post("/v1/messages", json=body, headers={"Host": "evil.example"}) as resp:
        assert resp.status == 403
        assert await resp.json() == {
            "type": "error",
            "error": {"type": "permission_error", "message": host_error("evil.example")},
        }


async def test_reference_errors_keep_the_detail_alone(make_client):
    client = await make_client(reference_errors=True)
    async with client.get(MODELS, headers={"Host": "evil.example"}) as resp:
        assert await resp.json() == {"detail": host_error("evil.example")}


async def test_allowed_hosts(make_client):
    client = await make_client(allowed_hosts=("edge.lan", ".example.org"))
    for host in ("edge.lan:8000", "EDGE.lan", "example.org", "llm.example.org:443"):
        async with client.get(MODELS, headers={"Host": host}) as resp:
            assert resp.status == 200, host
    for host in ("evil.example", "a.edge.lan"):
        async with client.get(MODELS, headers={"Host": host}) as resp:
            assert resp.status == 403, host


async def test_a_request_without_host_is_served(client):
    """HTTP/1.0 has no Host header (HAProxy's default health check); no browser sends one."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        writer.write(b"GET /health HTTP/1.0\r\n\r\n")
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.0 200 ")
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.fixture
def make_wildcard_server(aiohttp_server, engine, settings):
    """An app bound to 0.0.0.0 (every interface, so its own addresses are unknown)."""

    async def make(**overrides: Any) -> str:
        app = create_app(replace(settings, host="0.0.0.0", **overrides), EngineClient(engine))
        server = await aiohttp_server(app, host="0.0.0.0")
        return f"http://127.0.0.1:{server.port}"

    return make


async def test_wildcard_bind_serves_any_address_but_only_known_names(make_wildcard_server):
    url = await make_wildcard_server()
    async with aiohttp.ClientSession() as session:
        for host, status in (("192.0.2.7:8000", 200), ("[fd00::7]", 200), ("edge.lan", 403)):
            async with session.get(url + MODELS, headers={"Host": host}) as resp:
                assert resp.status == status, host


async def test_any_host_with_a_key_on_a_non_loopback_bind(make_wildcard_server):
    url = await make_wildcard_server(api_keys=("k",), allowed_hosts=("*",))
    async with aiohttp.ClientSession() as session:
        headers = {"Host": "rebound.evil.example"}
        async with session.get(url + MODELS, headers=headers) as resp:
            assert resp.status == 401  # the key still guards it
        headers["Authorization"] = "Bearer k"
        async with session.get(url + MODELS, headers=headers) as resp:
            assert resp.status == 200
