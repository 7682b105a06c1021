"""Which hosts a media download may reach (the SSRF rules that the request's URL check,
api/common/media.py, and the downloads' resolver, http/media_fetch.py, share).

- `is_public`: a global unicast address; an IPv6 address that carries an IPv4 address
  (IPv4-mapped, -compatible or -translated, NAT64's 64:ff9b::/96, 6to4) is judged as the IPv4
  address it carries, and local-use NAT64, Teredo and site-local addresses are never public;
- `literal_address`: the address an IP-literal host names. A host that ends in a number but is
  not an address in its canonical form (2130706433, 127.1, 0177.0.0.1, 0x7f.1, 0, 127.0.0.1.)
  is a `NumericHost`: resolvers and some HTTP clients read it as an IPv4 address, so it is
  refused, never looked up or connected to.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Final

from edgeserve.api.reference.detail import Detail

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# The IPv4 address is the last 32 bits: IPv4-compatible (deprecated; :: and ::1 included),
# IPv4-translated (SIIT) and NAT64's well-known prefix.
_LAST_32_BITS_IPV4: Final = tuple(
    ipaddress.IPv6Network(prefix) for prefix in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96")
)
# Local-use NAT64 (where the IPv4 address sits is the operator's choice), Teredo (a tunnel to
# whatever address its client part names) and site-local (deprecated private) addresses.
_NEVER_PUBLIC: Final = tuple(
    ipaddress.IPv6Network(prefix) for prefix in ("64:ff9b:1::/48", "2001::/32", "fec0::/10")
)
_NUMBER: Final = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")


def is_public(address: IPAddress) -> bool:
    """Whether `address` is a global unicast address (see the module's docstring)."""
    if isinstance(address, ipaddress.IPv6Address):
        carried = _carried_ipv4(address)
        if carried is not None:
            return is_public(carried)
        if any(address in network for network in _NEVER_PUBLIC):
            return False
    return address.is_global and not address.is_multicast


def _carried_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in _LAST_32_BITS_IPV4):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


class NumericHost(ValueError):
    """A host that ends in a number but is not an IP address in canonical form; `address` is
    the IPv4 address a resolver reads it as (inet_aton's reading; None when it reads none)."""

    def __init__(self, host: str) -> None:
        super().__init__(Detail.NUMERIC_HOST.format(host=host))
        self.host = host
        try:
            self.address: ipaddress.IPv4Address | None = ipaddress.IPv4Address(
                socket.inet_aton(host)
            )
        except OSError:
            self.address = None


def literal_address(host: str) -> IPAddress | None:
    """The address an IP-literal `host` names (IPv6 without brackets), or None for a host
    name; raises NumericHost for a host that ends in a number (its last label all digits, or
    0x and hex digits) but is not a canonical IP address."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    labels = host.split(".")
    if len(labels) > 1 and not labels[-1]:
        labels.pop()
    if _NUMBER.fullmatch(labels[-1]):
        raise NumericHost(host)
    return None
