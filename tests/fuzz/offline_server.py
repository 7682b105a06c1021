"""`python -m edgeserve` with no name resolution: every host name is unknown, IP literals
resolve as usual. The HTTP fuzzing runs the server this way, so that a media URL it invents
never makes the server ask a DNS server (the URL checks then answer as for a name that does
not exist)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from edgeserve.cli import main

_resolve = socket.getaddrinfo


def _literal_only(host: Any, *args: Any, **kwargs: Any) -> Any:
    """getaddrinfo for IP literals and no DNS name."""
    try:
        ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        if host is not None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
    return _resolve(host, *args, **kwargs)


if __name__ == "__main__":
    socket.getaddrinfo = _literal_only
    raise SystemExit(main())
