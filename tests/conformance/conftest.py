"""Conformance fixtures: the integration suite's app clients on a server with
--reference-errors (error bodies byte for byte the reference's) and --cors-origins reference
(any origin echoed with credentials, as the reference; edgeserve's default is divergence 18),
plus a guard that keeps every media-URL check off the network."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeserve.config import CORS_REFERENCE, Settings
from tests.integration.conftest import client, make_client, server_settings

__all__ = ["client", "make_client"]

_LOCAL_NAMES = frozenset({"localhost"})


@pytest.fixture
def settings(model_path: Path) -> Settings:
    """The integration settings with the reference's error bodies and CORS; a test of
    edgeserve's `message` passes `reference_errors=False` to make_client."""
    return server_settings(model_path, reference_errors=True, cors_origins=(CORS_REFERENCE,))


def _needs_no_network(host: object) -> bool:
    """True for names the real resolver answers without asking a DNS server."""
    if not isinstance(host, str) or host.lower() in _LOCAL_NAMES:
        return True
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    else:
        return True
    try:
        socket.inet_aton(host)  # the numbers-and-dots forms getaddrinfo parses itself
    except OSError:
        pass
    else:
        return True
    try:
        host.encode("idna")
    except UnicodeError:
        return True  # the real getaddrinfo fails on this before any lookup
    return False


@pytest.fixture(autouse=True)
def no_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Answer `*.invalid` as every resolver must (RFC 6761: no such name) without sending a
    query, pass literals and localhost to the real resolver, and fail the test on any other
    name (a test that would have touched the internet)."""
    real = socket.getaddrinfo
    unexpected: list[str] = []

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if _needs_no_network(host):
            return real(host, *args, **kwargs)
        if not host.lower().endswith(".invalid"):
            unexpected.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
    yield unexpected
    assert not unexpected, f"tried to resolve public names: {unexpected}"
