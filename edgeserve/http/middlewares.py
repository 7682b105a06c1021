"""Middlewares, outermost first: request context (id, access log, metrics, last-resort 500) →
trusted Host (403 against DNS rebinding) → CORS → API errors (ApiError and aiohttp's own
404/405/413 in the shape of the application that routed the request: `{"detail": …,
"message": …}`, Anthropic's `{"type": "error", "error": …}` in its sub-application, or Ollama's
`{"error": …}` on its paths)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from edgeserve.api.anthropic_messages.routes import anthropic_error_body
from edgeserve.api.ollama.routes import ollama_error_body
from edgeserve.api.reference.errors import error_body
from edgeserve.api.reference.request import (
    body_too_large,
    host_not_allowed,
    method_not_allowed,
    not_found,
)
from edgeserve.errors import ApiError, EngineFault, EngineRestarted
from edgeserve.http import browser
from edgeserve.http.keys import (
    ERRORS,
    KNOWN_PATHS,
    LEASES,
    METRICS,
    PATH_ERRORS,
    RECORD,
    SETTINGS,
    RequestRecord,
)
from edgeserve.metrics import CLIENT_CLOSED, OTHER_ROUTE

access_log = logging.getLogger("edgeserve.access")
http_log = logging.getLogger("edgeserve.http")

CORS_METHODS = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"


def reference_error_response(request: web.Request, err: ApiError) -> web.Response:
    """The JSON response for an ApiError: compact `{"detail": …, "message": …}`, or the
    reference's `{"detail": …}` alone with --reference-errors."""
    with_message = not request.config_dict[SETTINGS].reference_errors
    return web.Response(
        status=err.status,
        body=error_body(err.detail, with_message=with_message, code=err.code),
        content_type="application/json",
        headers=err.headers,
    )


def anthropic_error_response(request: web.Request, err: ApiError) -> web.Response:
    """The JSON response for an ApiError on an Anthropic endpoint."""
    status, body = anthropic_error_body(err)
    return web.Response(
        status=status, body=body, content_type="application/json", headers=err.headers
    )


def ollama_error_response(request: web.Request, err: ApiError) -> web.Response:
    """The JSON response for an ApiError on an Ollama endpoint."""
    status, body = ollama_error_body(err)
    return web.Response(
        status=status, body=body, content_type="application/json", headers=err.headers
    )


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Assign the request id, turn any escaped exception into 500 (or, once the response has
    started, end the connection, so that the client is not left waiting), and observe the
    finished request once: one access line and the metrics (499 when the client went away
    first)."""
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    record = RequestRecord(request_id=request_id)
    request[RECORD] = record
    started = time.perf_counter()
    status = 500
    try:
        async with contextlib.AsyncExitStack() as leases:
            request[LEASES] = leases
            response = await handler(request)
        status = response.status
    except asyncio.CancelledError:
        status = CLIENT_CLOSED
        raise
    except Exception:
        http_log.exception(
            "unhandled error in %s %s [%s]", request.method, request.path, request_id
        )
        if request.writer.output_size:
            raise  # a started response (a stream) cannot become a 500: aiohttp closes it
        response = web.Response(
            status=500, text="Internal Server Error", content_type="text/plain", charset="utf-8"
        )
    finally:
        elapsed = time.perf_counter() - started
        _log_access(request, record, status, elapsed)
        request.config_dict[METRICS].observe(_route(request), status, elapsed, record)
    if not response.prepared:
        response.headers["X-Request-Id"] = request_id
    return response


def _route(request: web.Request) -> str:
    """The `route` metrics label: the served path without the root_path prefix, or "other"."""
    path = request.path
    if path not in request.config_dict[KNOWN_PATHS]:
        return OTHER_ROUTE
    root = request.config_dict[SETTINGS].root_path
    if root and path.startswith(root + "/"):
        return path[len(root) :]
    return path


def _log_access(request: web.Request, record: RequestRecord, status: int, elapsed: float) -> None:
    """One line per request; the numbers travel as fields (text: key=value, JSON: keys)."""
    fields: dict[str, object] = {
        "request_id": record.request_id,
        "status": status,
        "ms": round(elapsed * 1000, 1),
    }
    if record.prompt_tokens is not None:
        fields["prompt_tokens"] = record.prompt_tokens
        fields["completion_tokens"] = record.completion_tokens
    if record.cached_tokens:
        fields["cached_tokens"] = record.cached_tokens
    if record.ttft_s is not None:
        fields["ttft_ms"] = round(record.ttft_s * 1000, 1)
    if record.gen_s and record.completion_tokens:
        fields["tokens_per_s"] = round(record.completion_tokens / record.gen_s, 1)
    drafted = sum(gen.drafted for gen in record.generations)
    if drafted:
        fields["draft_tokens"] = drafted
        fields["draft_accepted"] = sum(gen.draft_accepted for gen in record.generations)
    if record.error_status is not None:
        fields["error_status"] = record.error_status
    access_log.info("%s %s %d", request.method, request.path, status, extra=fields)


@web.middleware
async def trusted_host(request: web.Request, handler: Handler) -> web.StreamResponse:
    """403 for a Host header this server does not answer to (a DNS-rebinding page's name);
    requests without one (HTTP/1.0 health checks) pass. See `browser.host_allowed`."""
    settings = request.config_dict[SETTINGS]
    host = request.headers.get(hdrs.HOST)
    if host is None or browser.host_allowed(host, settings.host, settings.allowed_hosts):
        return await handler(request)
    return _error_for(request, host_not_allowed(browser.host_name(host)))


@web.middleware
async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """CORS for the origins `--cors-origins` grants (`browser.cors_grant`); a preflight from
    any other origin is refused with the reference's 400."""
    grant = _grant(request)
    if (
        request.method == "OPTIONS"
        and hdrs.ORIGIN in request.headers
        and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers
    ):
        if grant is None:
            return web.Response(status=400, text="Disallowed CORS origin")
        headers = {
            "Access-Control-Allow-Methods": CORS_METHODS,
            "Access-Control-Max-Age": "600",
        }
        requested = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS)
        if requested:
            headers["Access-Control-Allow-Headers"] = requested
        response = web.Response(status=200, text="OK", headers=headers)
        _add_cors_headers(response, grant)
        return response
    response = await handler(request)
    if not response.prepared:
        _add_cors_headers(response, grant)
    return response


def _grant(request: web.Request) -> browser.CorsGrant | None:
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is None:
        return None
    return browser.cors_grant(origin, request.config_dict[SETTINGS].cors_origins)


def _add_cors_headers(response: web.StreamResponse, grant: browser.CorsGrant | None) -> None:
    """Vary: Origin always (as the reference's Starlette does); the allow headers of `grant`."""
    response.headers["Vary"] = "Origin"
    if grant is not None:
        response.headers["Access-Control-Allow-Origin"] = grant.allow_origin
        if grant.credentials:
            response.headers["Access-Control-Allow-Credentials"] = "true"


def prepare_stream_headers(request: web.Request, response: web.StreamResponse) -> None:
    """CORS headers for a streamed response, which must be set before `prepare()`."""
    _add_cors_headers(response, _grant(request))


def _slashless_url(request: web.Request) -> str:
    """The absolute URL without the path's trailing slashes; the query string is kept byte for
    byte, as Starlette's redirect_slashes does."""
    target = str(request.url.with_path(request.path.rstrip("/")))
    query = request.raw_path.partition("?")[2]
    return f"{target}?{query}" if query else target


@web.middleware
async def api_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every client error leaves as `{"detail": …}` (plus `message`, see `error_response`) with
    the reference's status."""
    try:
        return await handler(request)
    except ApiError as err:
        if isinstance(err.__cause__, EngineFault | EngineRestarted):
            http_log.error("request %s: %s", request[RECORD].request_id, err.__cause__)
        error = err
    except web.HTTPNotFound:
        path = request.path
        if (
            len(path) > 1
            and path.endswith("/")
            and path.rstrip("/") in request.config_dict[KNOWN_PATHS]
        ):
            return web.Response(status=307, headers={"Location": _slashless_url(request)})
        error = not_found()
    except web.HTTPMethodNotAllowed as exc:
        error = method_not_allowed(sorted(exc.allowed_methods))
    except web.HTTPRequestEntityTooLarge:
        error = body_too_large(request.config_dict[SETTINGS].max_body_bytes)
    return _error_for(request, error)


def _error_for(request: web.Request, error: ApiError) -> web.Response:
    """`error` in the shape of the request's path where it has one of its own (Ollama's),
    else of the innermost application that routed the request (aiohttp's `config_dict` is
    fixed by the first middleware that reads it, so it cannot tell)."""
    responder = request.config_dict[PATH_ERRORS].get(request.path)
    return (responder or request.match_info.apps[-1][ERRORS])(request, error)
