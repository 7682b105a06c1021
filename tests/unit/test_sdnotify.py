"""sd_notify over a unix datagram socket: paths, abstract names, no-ops, never raising."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from edgeserve import sdnotify


@pytest.fixture
def listener(tmp_path) -> Iterator[tuple[socket.socket, str]]:
    """A bound notify socket (what systemd listens on) and its $NOTIFY_SOCKET value."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(2)
        yield sock, str(path)


def test_states_go_as_one_datagram(listener):
    sock, address = listener
    assert sdnotify.notify(sdnotify.READY, "STATUS=up", environ={"NOTIFY_SOCKET": address})
    assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_abstract_namespace_socket():
    name = f"edgeserve-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(2)
        assert sdnotify.notify(sdnotify.WATCHDOG, environ={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_reads_the_process_environment(listener, monkeypatch):
    sock, address = listener
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert sdnotify.notify(sdnotify.STOPPING)
    assert sock.recv(4096) == b"STOPPING=1"


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param({}, id="unset"),
        pytest.param({"NOTIFY_SOCKET": ""}, id="empty"),
        pytest.param({"NOTIFY_SOCKET": "@"}, id="bare-at"),
        pytest.param({"NOTIFY_SOCKET": "vsock:2:1234"}, id="vsock"),
        pytest.param({"NOTIFY_SOCKET": "relative/path"}, id="relative"),
    ],
)
def test_no_op_without_a_usable_socket(environ):
    assert sdnotify.notify(sdnotify.READY, environ=environ) is False


def test_no_states_sends_nothing(listener):
    sock, address = listener
    assert sdnotify.notify(environ={"NOTIFY_SOCKET": address}) is False
    sock.settimeout(0.05)
    with pytest.raises(TimeoutError):
        sock.recv(4096)


@pytest.mark.parametrize("target", ["/nonexistent/notify.sock", "@edgeserve-nobody-listens"])
def test_failures_are_reported_not_raised(target):
    assert sdnotify.notify(sdnotify.READY, environ={"NOTIFY_SOCKET": target}) is False


def test_a_stream_socket_is_not_a_notify_socket(tmp_path):
    path = tmp_path / "stream.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
        sock.listen()
        assert sdnotify.notify(sdnotify.READY, environ={"NOTIFY_SOCKET": str(path)}) is False


def test_status_is_one_line():
    assert sdnotify.status("loading\nmodel.gguf") == "STATUS=loading model.gguf"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({"WATCHDOG_USEC": "30000000"}, 15.0, id="half-of-usec"),
        pytest.param({"WATCHDOG_USEC": "1000"}, 0.0005, id="small"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "self"}, 15.0, id="our-pid"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None, id="other-pid"),
        pytest.param({}, None, id="unset"),
        pytest.param({"WATCHDOG_USEC": "0"}, None, id="zero"),
        pytest.param({"WATCHDOG_USEC": "-5"}, None, id="negative"),
        pytest.param({"WATCHDOG_USEC": "soon"}, None, id="not-a-number"),
        pytest.param({"WATCHDOG_USEC": "30000000", "NOTIFY_SOCKET": ""}, None, id="no-socket"),
    ],
)
def test_watchdog_interval(environ, expected):
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", **environ}
    if env.get("WATCHDOG_PID") == "self":
        env["WATCHDOG_PID"] = str(os.getpid())
    assert sdnotify.watchdog_interval(env) == expected


def test_watchdog_interval_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval() == 2.0


@pytest.mark.timeout(20)
def test_a_full_queue_fails_instead_of_blocking(listener):
    """Nobody reads the socket (a stuck systemd): notify gives up rather than stall the loop."""
    _, address = listener
    environ = {"NOTIFY_SOCKET": address}
    results = [sdnotify.notify(sdnotify.WATCHDOG, environ=environ) for _ in range(5000)]
    assert results[0] is True
    assert results[-1] is False
