"""edgeserve.http.browser: the CORS grant and the Host check as pure functions."""

from __future__ import annotations

import pytest

from edgeserve.http.browser import (
    CorsGrant,
    cors_grant,
    host_allowed,
    host_name,
    is_loopback_origin,
)

LOCAL = ("local",)


@pytest.mark.parametrize(
    ("origin", "loopback"),
    [
        ("http://localhost:3000", True),
        ("https://localhost", True),
        ("http://LOCALHOST:8080", True),
        ("http://127.0.0.1:5173", True),
        ("http://127.8.9.10", True),
        ("http://[::1]:8000", True),
        ("https://[::1]", True),
        ("http://localhost.evil.example", False),
        ("http://evil.example", False),
        ("http://192.168.1.5:3000", False),
        ("file://localhost", False),
        ("null", False),
        ("http://localhost:notaport", False),
        ("http://[::1", False),
    ],
)
def test_loopback_origins(origin, loopback):
    assert is_loopback_origin(origin) is loopback


@pytest.mark.parametrize(
    ("origin", "entries", "grant"),
    [
        ("http://localhost:3000", LOCAL, CorsGrant("http://localhost:3000", True)),
        ("https://evil.example", LOCAL, None),
        ("https://evil.example", (), None),
        ("http://localhost:3000", (), None),
        ("http://localhost:3000", ("https://app.example",), None),
        ("https://app.example", ("https://app.example",), CorsGrant("https://app.example", True)),
        ("https://APP.example", ("https://app.example",), CorsGrant("https://APP.example", True)),
        ("https://app.example:8443", ("https://app.example",), None),
        ("https://evil.example", ("*",), CorsGrant("*", False)),
        ("http://localhost:1", ("local", "*"), CorsGrant("http://localhost:1", True)),
        ("https://evil.example", ("reference",), CorsGrant("https://evil.example", True)),
    ],
)
def test_cors_grant(origin, entries, grant):
    assert cors_grant(origin, entries) == grant


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8000", "localhost"),
        ("LocalHost.", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("edge.lan:443", "edge.lan"),
        ("::1", "::1"),
    ],
)
def test_host_name(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize(
    ("header", "bound", "allowed", "ok"),
    [
        ("localhost:8000", "127.0.0.1", (), True),
        ("127.0.0.1:8000", "127.0.0.1", (), True),
        ("127.0.0.2", "127.0.0.1", (), True),
        ("[::1]:8000", "127.0.0.1", (), True),
        ("evil.example:8000", "127.0.0.1", (), False),
        ("localhost.evil.example", "127.0.0.1", (), False),
        ("192.168.1.5:8000", "127.0.0.1", (), False),
        ("edge.lan:8000", "127.0.0.1", ("edge.lan",), True),
        ("EDGE.LAN.:8000", "127.0.0.1", ("edge.lan",), True),
        ("a.edge.lan", "127.0.0.1", ("edge.lan",), False),
        ("a.edge.lan", "127.0.0.1", (".edge.lan",), True),
        ("edge.lan", "127.0.0.1", (".edge.lan",), True),
        ("badedge.lan", "127.0.0.1", (".edge.lan",), False),
        ("192.168.1.5:8000", "192.168.1.5", (), True),
        ("192.168.1.6:8000", "192.168.1.5", (), False),
        ("edge.lan", "edge.lan", (), True),
        ("192.168.1.5", "0.0.0.0", (), True),
        ("[fd00::5]:8000", "::", (), True),
        ("edge.lan", "0.0.0.0", (), False),
        ("evil.example", "0.0.0.0", ("*",), True),
    ],
)
def test_host_allowed(header, bound, allowed, ok):
    assert host_allowed(header, bound, allowed) is ok
