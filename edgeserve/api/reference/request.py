"""The checks before an endpoint's own: the API key (401), the body decoded (422 json_invalid,
400), the schema (422 in FastAPI's item shape, parse_body) and what the model can do (405); and
the 404, 405 and 413 of a request no handler takes. edgeserve/http/request.py runs them in the
reference's order, except that a configured key is decided before the body is read."""

from __future__ import annotations

import email.message
import hmac
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from edgeserve import errors
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import bad


class _EmptyBody:
    """The body of a request that sent no bytes (distinct from a JSON `null` body)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EMPTY_BODY"


EMPTY_BODY: Final = _EmptyBody()
"""What decode_json_body returns for an empty body; parse_* turn it into 422 `missing`."""

_MISSING_BODY_ITEM: Final = {
    "type": "missing",
    "loc": ["body"],
    "msg": "Field required",
    "input": None,
}
_MAX_ECHO_DEPTH: Final = 100

_Model = TypeVar("_Model", bound=BaseModel)


def decode_json_body(raw: bytes, content_type: str | None) -> Any:
    """Decode a request body as FastAPI does before auth and validation.

    Empty → EMPTY_BODY. A JSON content type (application/json, application/*+json, parameters
    allowed) → json.loads, raising 422 json_invalid or 400 for undecodable bytes. Anything else,
    including no content type → the raw body as a str (invalid UTF-8 replaced), which schema
    validation then rejects with 422 model_attributes_type.
    """
    if not raw:
        return EMPTY_BODY
    if not _is_json_content_type(content_type):
        return raw.decode("utf-8", errors="replace")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        item = {
            "type": "json_invalid",
            "loc": ["body", exc.pos],
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": exc.msg},
        }
        raise errors.ApiError(422, [item]) from exc
    except (ValueError, RecursionError) as exc:
        raise bad(Detail.BODY_UNPARSABLE) from exc


def _is_json_content_type(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def check_api_key(
    authorization: str | None, keys: Sequence[str], x_api_key: str | None = None
) -> None:
    """401 unless the bearer credentials, or the `x-api-key` header's value (Anthropic's way),
    equal one of `keys`; no-op when no key is configured.

    The Authorization header is split at its first space; the scheme is case-insensitive and
    the credentials are stripped. Every key is compared in constant time. Empty keys are
    ignored (an empty API_KEY disables auth, as in the reference); a bare str is taken as one
    key.
    """
    active = [key for key in ((keys,) if isinstance(keys, str) else keys) if key]
    if not active:
        return
    given = [
        text.encode("utf-8", "surrogatepass")
        for text in (_bearer_credentials(authorization), x_api_key and x_api_key.strip())
        if text
    ]
    matches = [
        hmac.compare_digest(credentials, key.encode("utf-8", "surrogatepass"))
        for credentials in given
        for key in active
    ]
    if not any(matches):
        raise errors.ApiError(401, Detail.INVALID_API_KEY)


def _bearer_credentials(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if not scheme or not credentials or scheme.lower() != "bearer":
        return None
    return credentials


def parse_body(model: type[_Model], body: Any) -> _Model:
    """`body` validated against `model`; 422 with every error, FastAPI-shaped (EMPTY_BODY: one
    `missing` item)."""
    if body is EMPTY_BODY:
        raise errors.ApiError(422, [dict(_MISSING_BODY_ITEM)])
    try:
        return model.model_validate(body, from_attributes=True)
    except ValidationError as exc:
        items = [_error_item(error) for error in exc.errors(include_url=False)]
        raise errors.ApiError(422, items) from None


def _error_item(error: Mapping[str, Any]) -> dict[str, Any]:
    item = {
        "type": error["type"],
        "loc": ["body", *error["loc"]],
        "msg": error["msg"],
        "input": _json_safe(error["input"]),
    }
    if "ctx" in error:
        item["ctx"] = _json_safe(error["ctx"])
    return item


def _json_safe(value: Any, depth: int = 0) -> Any:
    """Make a 422 value JSON-encodable: non-finite floats → null, unknown objects → str, and
    containers nested deeper than _MAX_ECHO_DEPTH → "..." (so echoing an absurdly deep input
    cannot exhaust the recursion limit)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int):
        return value
    if isinstance(value, dict | list | tuple) and depth >= _MAX_ECHO_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {str(key): _json_safe(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item, depth + 1) for item in value]
    return str(value)


def check_can_generate(can_generate: bool) -> None:
    """405 "Not allowed" for chat on a model that cannot generate."""
    if not can_generate:
        raise errors.ApiError(405, Detail.NOT_ALLOWED)


def check_can_score(can_score: bool) -> None:
    """405 "Not allowed" for scoring on a model that cannot score (divergence 3: generative
    models can)."""
    if not can_score:
        raise errors.ApiError(405, Detail.NOT_ALLOWED)


def body_too_large(limit_bytes: int) -> errors.ApiError:
    """413 for a body over the configured size limit."""
    return errors.ApiError(413, Detail.BODY_TOO_LARGE.format(limit=limit_bytes))


def host_not_allowed(host: str) -> errors.ApiError:
    """403 for a request whose Host header names a host this server does not answer to."""
    return errors.ApiError(403, Detail.HOST_NOT_ALLOWED.format(host=host))


def not_found() -> errors.ApiError:
    """404 for an unknown path (E16)."""
    return errors.ApiError(404, Detail.NOT_FOUND)


def method_not_allowed(allowed: Iterable[str]) -> errors.ApiError:
    """405 for a known path with the wrong method (E17), with the Allow header."""
    return errors.ApiError(405, Detail.METHOD_NOT_ALLOWED, {"Allow": ", ".join(allowed)})
