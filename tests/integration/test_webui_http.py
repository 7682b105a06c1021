"""The chat page over plain HTTP: its files' types, caching and security headers, the API key
(the page needs none, the API it calls does), the Host check, root_path, and `--no-webui`."""

from __future__ import annotations

import pytest

from edgeserve.http.chat_page import CONTENT_SECURITY_POLICY

pytestmark = pytest.mark.needs_model

FILES = {
    "/": "text/html; charset=utf-8",
    "/webui/app.js": "text/javascript; charset=utf-8",
    "/webui/format.js": "text/javascript; charset=utf-8",
    "/webui/style.css": "text/css; charset=utf-8",
    "/webui/icon.svg": "image/svg+xml",
}


@pytest.mark.parametrize(("path", "content_type"), FILES.items())
async def test_files_have_their_type_and_headers(client, path, content_type):
    async with client.get(path) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == content_type
        assert resp.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["X-Frame-Options"] == "DENY"
        assert resp.headers["Cache-Control"] == "no-cache"
        assert resp.headers["Vary"] == "Origin"
        etag = resp.headers["ETag"]
        body = await resp.read()
    assert body
    async with client.get(path, headers={"If-None-Match": etag}) as resp:
        assert resp.status == 304
        assert resp.headers["ETag"] == etag
        assert resp.headers["Cache-Control"] == "no-cache"
        assert await resp.read() == b""


async def test_the_page_needs_no_key_and_the_api_does(make_client):
    client = await make_client(api_keys=("k",))
    for path in FILES:
        async with client.get(path) as resp:
            assert resp.status == 200, path
    async with client.get("/v1/models") as resp:
        assert resp.status == 401


async def test_a_foreign_host_gets_no_page(client):
    async with client.get("/", headers={"Host": "evil.example"}) as resp:
        assert resp.status == 403


async def test_the_page_under_root_path(make_client):
    client = await make_client(root_path="/api")
    for path in ("/", "/api/", "/api/webui/app.js"):
        async with client.get(path) as resp:
            assert resp.status == 200, path


@pytest.mark.parametrize("path", ["/", "/webui/app.js", "/webui/style.css"])
async def test_no_webui_answers_404_as_before(make_client, path):
    client = await make_client(no_webui=True)
    async with client.get(path) as resp:
        assert resp.status == 404
        assert await resp.json() == {"detail": "Not Found", "message": "Not Found"}
        assert "Content-Security-Policy" not in resp.headers
    async with client.get("/health") as resp:
        assert resp.status == 200


async def test_unknown_files_are_404(client):
    for path in ("/index.html", "/webui/", "/webui/nope.js", "/webui/../pyproject.toml"):
        async with client.get(path) as resp:
            assert resp.status == 404, path
