"""What web pages may do with this server: CORS grants, and the Host check against DNS
rebinding. Pure functions of header values and settings (see `--cors-origins` and
`--allowed-hosts` in edgeserve.config)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from edgeserve.config import ANY_HOST, CORS_ANY, CORS_LOCAL, CORS_REFERENCE, is_loopback


@dataclass(frozen=True)
class CorsGrant:
    """The `Access-Control-Allow-Origin` value, and whether credentials are allowed too."""

    allow_origin: str
    credentials: bool


def is_loopback_origin(origin: str) -> bool:
    """`http(s)://` on localhost or a loopback address, any port."""
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 (raises ValueError for a malformed port)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and is_loopback(parts.hostname or "")


def cors_grant(origin: str, entries: tuple[str, ...]) -> CorsGrant | None:
    """The grant for a page at `origin` under `--cors-origins` `entries`, or None (no CORS).

    A listed origin, a loopback one under `local`, or any under `reference` is echoed with
    credentials (the reference's answer); any other under `*` gets `*` without credentials."""
    if (
        CORS_REFERENCE in entries
        or origin.lower() in entries
        or (CORS_LOCAL in entries and is_loopback_origin(origin))
    ):
        return CorsGrant(origin, credentials=True)
    if CORS_ANY in entries:
        return CorsGrant("*", credentials=False)
    return None


def host_name(host_header: str) -> str:
    """The Host header's name or address: port, IPv6 brackets and a final dot removed,
    lowercased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def host_allowed(host_header: str, bound: str, allowed: tuple[str, ...]) -> bool:
    """Whether a request whose Host header is `host_header` may be served by a server bound to
    `bound` with `--allowed-hosts` `allowed`.

    Allowed: localhost and loopback addresses, the bound address, a listed name (`.name`: it
    and its subdomains), anything under `*`; with a wildcard bind (0.0.0.0 or ::) every IP
    address, since the machine's own are not known and an address cannot be rebound."""
    host = host_name(host_header)
    if ANY_HOST in allowed or is_loopback(host) or host in allowed:
        return True
    if any(entry.startswith(".") and f".{host}".endswith(entry) for entry in allowed):
        return True
    address, bound_address = _address(host), _address(host_name(bound))
    if address is None:
        return host == host_name(bound)
    return bound_address is not None and (bound_address.is_unspecified or address == bound_address)
