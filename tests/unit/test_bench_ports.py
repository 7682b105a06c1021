"""The bench's port choice: a port handed to a server still loading is not handed out again."""

from __future__ import annotations

import socket
from typing import Any, ClassVar

import pytest

from bench import anchors


class ScriptedFakeSocket:
    """A fake socket whose bind to port 0 lands on the next port of a script, as the kernel
    may offer a port again while the server given it has not bound it yet."""

    offered: ClassVar[list[int]] = []

    def __enter__(self) -> ScriptedFakeSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, address: tuple[str, int]) -> None:
        self.port = self.offered.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return (anchors.HOST, self.port)


def test_a_port_already_handed_out_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    fake: Any = ScriptedFakeSocket
    monkeypatch.setattr(anchors.socket, "socket", fake)
    ScriptedFakeSocket.offered = [40001, 40001, 40002, 40001, 40003]
    first = anchors.free_port()
    second = anchors.free_port({first})
    third = anchors.free_port({first, second})
    assert (first, second, third) == (40001, 40002, 40003)


def test_the_port_is_free_on_this_machine() -> None:
    port = anchors.free_port()
    with socket.socket() as sock:
        sock.bind((anchors.HOST, port))
