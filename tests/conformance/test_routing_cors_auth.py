"""reference-api.md §1.1 (auth), §2 step 1 (routing) and §9 (CORS, root_path) over HTTP."""

from __future__ import annotations

import time

import pytest

from tests.conformance.wire import CHAT, JSON, MODELS, SCORE, assert_error, detail, send

INVALID_KEY = detail("Invalid API key.")

# ---- authentication ---------------------------------------------------------------------------

# (configured keys, Authorization header or None, expected status on GET /v1/models)
AUTH = [
    pytest.param(("k",), None, 401, id="missing-header"),
    pytest.param(("k",), "", 401, id="empty-header"),
    pytest.param(("k",), "Bearer k", 200, id="bearer"),
    pytest.param(("k",), "bearer k", 200, id="lowercase-scheme"),
    pytest.param(("k",), "BEARER k", 200, id="uppercase-scheme"),
    pytest.param(("k",), "BeArEr k", 200, id="mixed-case-scheme"),
    pytest.param(("k",), "Bearer  k", 200, id="first-space-split-then-strip"),
    pytest.param(("k",), "Bearer k \t", 200, id="trailing-whitespace-stripped"),
    pytest.param(("k",), "Bearer \tk", 200, id="leading-tab-stripped"),
    pytest.param(("k",), "Bearer K", 401, id="key-is-case-sensitive"),
    pytest.param(("k",), "Bearer wrong", 401, id="wrong-key"),
    pytest.param(("k",), "Bearer k k", 401, id="inner-space-kept"),
    pytest.param(("k",), "Bearer kk", 401, id="longer-key"),
    pytest.param(("k",), "Bearer", 401, id="scheme-only"),
    pytest.param(("k",), "Bearer ", 401, id="empty-credentials"),
    pytest.param(("k",), "Bearer   ", 401, id="blank-credentials"),
    pytest.param(("k",), "Bearer\tk", 401, id="tab-is-not-the-separator"),
    pytest.param(("k",), "Basic k", 401, id="basic-scheme"),
    pytest.param(("k",), "Token k", 401, id="token-scheme"),
    pytest.param(("k",), "k", 401, id="bare-key"),
    pytest.param(("k",), " Bearer k", 200, id="header-whitespace-is-trimmed-by-http"),
    pytest.param(("a", "b"), "Bearer a", 200, id="several-keys-first"),
    pytest.param(("a", "b"), "Bearer b", 200, id="several-keys-second"),
    pytest.param(("a", "b"), "Bearer c", 401, id="several-keys-neither"),
    pytest.param(("a", "b"), "Bearer a,b", 401, id="several-keys-joined"),
    pytest.param(("a", "b"), None, 401, id="several-keys-missing"),
    pytest.param((), None, 200, id="no-keys-no-header"),
    pytest.param((), "Bearer anything", 200, id="no-keys-any-header"),
    pytest.param((), "Basic junk", 200, id="no-keys-any-scheme"),
    pytest.param(("",), None, 200, id="empty-key-disables-auth"),
]


@pytest.mark.parametrize(("keys", "authorization", "status"), AUTH)
async def test_auth_on_models(make_client, keys, authorization, status):
    client = await make_client(api_keys=keys)
    headers = {} if authorization is None else {"Authorization": authorization}
    reply = await send(client, "GET", MODELS, headers=headers, ctype=None)
    if status == 401:
        assert_error(reply, 401, INVALID_KEY)
        assert "WWW-Authenticate" not in reply.headers
    else:
        assert reply.status == 200, reply.body


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(
            CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, id="chat"
        ),
        pytest.param(SCORE, {"model": "m", "messages": ["hi"]}, id="score"),
        pytest.param("/v1/completions", {"model": "m", "prompt": "hi"}, id="completions"),
    ],
)
@pytest.mark.parametrize("authorization", [None, "Bearer nope", "Basic k"])
async def test_auth_on_post_routes(make_client, path, body, authorization):
    client = await make_client(api_keys=("k",))
    headers = {} if authorization is None else {"Authorization": authorization}
    assert_error(await send(client, "POST", path, body, headers=headers), 401, INVALID_KEY)


async def test_models_ignores_a_body(client):
    reply = await send(client, "GET", MODELS, raw=b"{bad", ctype=JSON)
    assert reply.status == 200, reply.body


async def test_health_needs_no_key(make_client):
    client = await make_client(api_keys=("k",))
    reply = await send(client, "GET", "/health", ctype=None)
    assert reply.status == 200
    assert reply.json()["status"] == "ok"


# ---- routing ----------------------------------------------------------------------------------

# (method, path, status, detail, Allow header or None)
ROUTING = [
    pytest.param("GET", "/v1/nope", 404, "Not Found", None, id="unknown"),
    # The reference has no /v1/completions (404); edgeserve serves OpenAI's legacy endpoint.
    pytest.param("GET", "/v1/completions", 405, "Method Not Allowed", "POST", id="get-completions"),
    pytest.param("GET", "/v1/models/x", 404, "Not Found", None, id="below-models"),
    pytest.param("GET", "/v1/nope/", 404, "Not Found", None, id="unknown-with-slash"),
    pytest.param("GET", "/V1/MODELS", 404, "Not Found", None, id="case-sensitive"),
    pytest.param("POST", MODELS, 405, "Method Not Allowed", "GET", id="post-models"),
    pytest.param("DELETE", MODELS, 405, "Method Not Allowed", "GET", id="delete-models"),
    pytest.param("OPTIONS", MODELS, 405, "Method Not Allowed", "GET", id="options-no-cors"),
    pytest.param("GET", CHAT, 405, "Method Not Allowed", "POST", id="get-chat"),
    pytest.param("PUT", CHAT, 405, "Method Not Allowed", "POST", id="put-chat"),
    pytest.param("PATCH", CHAT, 405, "Method Not Allowed", "POST", id="patch-chat"),
    pytest.param("GET", SCORE, 405, "Method Not Allowed", "POST", id="get-score"),
    pytest.param("DELETE", SCORE, 405, "Method Not Allowed", "POST", id="delete-score"),
    pytest.param("POST", "/health", 405, "Method Not Allowed", "GET", id="post-health"),
]


@pytest.mark.parametrize(("method", "path", "status", "text", "allow"), ROUTING)
async def test_routing_errors(client, method, path, status, text, allow):
    reply = await send(client, method, path, ctype=None)
    assert_error(reply, status, detail(text))
    assert reply.headers.get("Allow") == allow
    assert reply.headers["Vary"] == "Origin"


async def test_root_without_the_chat_page_is_404(make_client):
    """`/` is edgeserve's chat page (README divergence 20); --no-webui gives the reference's
    404."""
    client = await make_client(no_webui=True)
    reply = await send(client, "GET", "/", ctype=None)
    assert_error(reply, 404, detail("Not Found"))
    assert reply.headers["Vary"] == "Origin"


async def test_head_on_models_is_405(client):
    reply = await send(client, "HEAD", MODELS, ctype=None)
    assert reply.status == 405
    assert reply.headers["Allow"] == "GET"
    assert reply.body == b""


@pytest.mark.parametrize(
    ("method", "path", "target"),
    [
        pytest.param("GET", "/v1/models/", MODELS, id="models"),
        pytest.param("GET", "/v1/models//", MODELS, id="models-double-slash"),
        pytest.param("POST", "/v1/chat/completions/", CHAT, id="chat"),
        pytest.param("POST", "/v1/score/evaluation/", SCORE, id="score"),
        pytest.param("DELETE", "/v1/models/", MODELS, id="wrong-method-still-redirects"),
        pytest.param("GET", "/v1/models/?a=1&b=x%20y", MODELS + "?a=1&b=x%20y", id="keeps-query"),
    ],
)
async def test_trailing_slash_redirects(make_client, method, path, target):
    client = await make_client(api_keys=("k",))  # the redirect comes before auth
    reply = await send(client, method, path, ctype=None)
    assert reply.status == 307
    assert reply.body == b""
    host = f"http://{client.server.host}:{client.server.port}"
    assert reply.headers["Location"] == host + target


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("GET", "/api/v1/models", 200, id="prefixed"),
        pytest.param("GET", "/v1/models", 200, id="unprefixed"),
        pytest.param("GET", "/api/health", 200, id="prefixed-health"),
        pytest.param("GET", "/api/v1/chat/completions", 405, id="prefixed-405"),
        pytest.param("GET", "/api/nope", 404, id="prefixed-404"),
        pytest.param("GET", "/apiv1/models", 404, id="no-separator"),
    ],
)
async def test_root_path(make_client, method, path, status):
    client = await make_client(root_path="/api")
    reply = await send(client, method, path, ctype=None)
    assert reply.status == status, reply.body
    if status == 200 and path.endswith("models"):
        assert reply.json()["data"][0]["id"] == "gemma-test"


async def test_root_path_trailing_slash_redirect(make_client):
    client = await make_client(root_path="/api")
    reply = await send(client, "GET", "/api/v1/models/", ctype=None)
    assert reply.status == 307
    host = f"http://{client.server.host}:{client.server.port}"
    assert reply.headers["Location"] == host + "/api/v1/models"


# ---- /v1/models -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gemma-test", "my-org/Módel:v1 ü"])
async def test_models_body(make_client, name):
    client = await make_client(model_name=name)
    before = int(time.time())
    reply = await send(client, "GET", MODELS, ctype=None)
    after = int(time.time())
    assert reply.status == 200
    assert reply.headers["Content-Type"] == JSON
    created = reply.json()["data"][0]["created"]
    assert before <= created <= after
    expected = {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": "owner"}],
    }
    assert (
        reply.body
        == __import__("json").dumps(expected, separators=(",", ":"), ensure_ascii=False).encode()
    )
    assert reply.headers["Content-Length"] == str(len(reply.body))


# ---- CORS -------------------------------------------------------------------------------------

ORIGIN = "http://app.example:3000"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        pytest.param("GET", MODELS, None, 200, id="models"),
        pytest.param("POST", CHAT, {"model": "m", "messages": []}, 400, id="400"),
        pytest.param("GET", "/v1/nope", None, 404, id="404"),
        pytest.param("GET", CHAT, None, 405, id="405"),
        pytest.param("POST", CHAT, {"model": "m"}, 422, id="422"),
    ],
)
async def test_cors_simple_request_echoes_origin(client, method, path, body, status):
    reply = await send(client, method, path, body, headers={"Origin": ORIGIN})
    assert reply.status == status
    assert reply.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert reply.headers["Access-Control-Allow-Credentials"] == "true"
    assert reply.headers["Vary"] == "Origin"


async def test_cors_simple_request_on_401(make_client):
    client = await make_client(api_keys=("k",))
    reply = await send(client, "GET", MODELS, headers={"Origin": ORIGIN}, ctype=None)
    assert_error(reply, 401, INVALID_KEY)
    assert reply.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert reply.headers["Access-Control-Allow-Credentials"] == "true"


async def test_no_origin_no_cors_headers_but_vary(client):
    reply = await send(client, "GET", MODELS, ctype=None)
    assert reply.status == 200
    assert reply.headers["Vary"] == "Origin"
    assert "Access-Control-Allow-Origin" not in reply.headers
    assert "Access-Control-Allow-Credentials" not in reply.headers


@pytest.mark.parametrize(
    ("path", "keys"),
    [
        pytest.param(CHAT, (), id="chat"),
        pytest.param(CHAT, ("k",), id="bypasses-auth"),
        pytest.param(SCORE, ("k",), id="score"),
        pytest.param(MODELS, (), id="models"),
        pytest.param("/v1/nope", (), id="before-routing"),
    ],
)
async def test_cors_preflight(make_client, path, keys):
    client = await make_client(api_keys=keys)
    reply = await send(client, "OPTIONS", path, headers=PREFLIGHT, ctype=None)
    assert (reply.status, reply.body) == (200, b"OK")
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert reply.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert reply.headers["Access-Control-Allow-Credentials"] == "true"
    assert reply.headers["Access-Control-Allow-Methods"] == (
        "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
    )
    assert reply.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert reply.headers["Access-Control-Max-Age"] == "600"
    assert "Origin" in [v.strip() for v in reply.headers["Vary"].split(",")]


async def test_cors_preflight_without_requested_headers(client):
    headers = {"Origin": ORIGIN, "Access-Control-Request-Method": "GET"}
    reply = await send(client, "OPTIONS", MODELS, headers=headers, ctype=None)
    assert (reply.status, reply.body) == (200, b"OK")
    assert reply.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "Access-Control-Allow-Headers" not in reply.headers


async def test_options_with_origin_but_no_request_method_is_not_a_preflight(client):
    reply = await send(client, "OPTIONS", CHAT, headers={"Origin": ORIGIN}, ctype=None)
    assert_error(reply, 405, detail("Method Not Allowed"))
    assert reply.headers["Allow"] == "POST"


ALLOWED = "http://a.example"


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        pytest.param(ALLOWED, True, id="configured"),
        pytest.param("http://b.example", False, id="other"),
        pytest.param("http://a.example:8080", False, id="other-port"),
        pytest.param("https://a.example", False, id="other-scheme"),
    ],
)
async def test_configured_origins(make_client, origin, allowed):
    client = await make_client(cors_origins=(ALLOWED,))
    simple = await send(client, "GET", MODELS, headers={"Origin": origin}, ctype=None)
    assert simple.status == 200
    assert simple.headers["Vary"] == "Origin"
    assert simple.headers.get("Access-Control-Allow-Origin") == (origin if allowed else None)
    preflight = await send(
        client, "OPTIONS", CHAT, headers={**PREFLIGHT, "Origin": origin}, ctype=None
    )
    if allowed:
        assert (preflight.status, preflight.body) == (200, b"OK")
        assert preflight.headers["Access-Control-Allow-Origin"] == origin
    else:
        assert (preflight.status, preflight.body) == (400, b"Disallowed CORS origin")
        assert "Access-Control-Allow-Origin" not in preflight.headers
