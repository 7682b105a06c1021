"""The systemd notify protocol (sd_notify(3)), without libsystemd.

Under a `Type=notify` unit systemd passes `$NOTIFY_SOCKET`: a unix datagram socket, either a
path or (starting with `@`) a name in the abstract namespace. Each state is one datagram of
newline-separated `KEY=VALUE` lines: `READY=1`, `STOPPING=1`, `WATCHDOG=1`, `STATUS=…`.

Outside systemd (`$NOTIFY_SOCKET` unset) everything here is a no-op. Nothing here raises: a
failed notification is logged at debug level and reported as False, never an error in the server.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

from edgeserve.log import ROOT

log = logging.getLogger(ROOT)

READY = "READY=1"
STOPPING = "STOPPING=1"
WATCHDOG = "WATCHDOG=1"


def status(text: str) -> str:
    """A `STATUS=` line (one line: newlines would start another assignment)."""
    return "STATUS=" + " ".join(text.splitlines())


def _address(value: str) -> str | bytes | None:
    """The socket address for `$NOTIFY_SOCKET`: a path, or `@name` for the abstract namespace."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    return None  # vsock: and other transports are not supported


def notify(*states: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send `states` as one datagram to `$NOTIFY_SOCKET`; True when it was sent.

    A no-op (False) when the variable is unset. Never blocks (a full socket queue is a failed
    notification) and never raises: errors are logged at debug level.
    """
    env = os.environ if environ is None else environ
    target = env.get("NOTIFY_SOCKET", "")
    if not target or not states:
        return False
    address = _address(target)
    if address is None:
        log.debug("NOTIFY_SOCKET=%s is not a unix socket address; not notifying", target)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            # Non-blocking: called from the event loop, it must not wait on a full queue.
            sock.setblocking(False)
            sock.connect(address)
            sock.send("\n".join(states).encode())
    except (OSError, UnicodeError) as exc:
        log.debug("sd_notify %s to %s failed: %s", states, target, exc)
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of `$WATCHDOG_USEC`), or None when not asked.

    As sd_watchdog_enabled(3): `$WATCHDOG_PID`, when set, must be this process.
    """
    env = os.environ if environ is None else environ
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0 or not env.get("NOTIFY_SOCKET"):
        return None
    pid = env.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    return usec / 2 / 1_000_000
