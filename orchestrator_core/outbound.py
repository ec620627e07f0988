"""Where the server may connect on a user's behalf (a flow's ``http`` tools).

An address is refused when it is loopback, private (RFC 1918, unique local, shared
address space), link-local, multicast, unspecified, reserved, or a cloud metadata service,
in every spelling: the host is resolved first (so ``2130706433``, ``0x7f.0.0.1``,
``0177.0.0.1`` and ``localhost`` are all 127.0.0.1), IPv6 is checked as such, and an
IPv4-mapped or IPv4-compatible IPv6 address (``::ffff:127.0.0.1``) as the IPv4 address it
carries. An operator allows hosts or networks by name or CIDR (``tools.allow_hosts``): an
allowed name is allowed whatever it resolves to; an allowed network allows the addresses in
it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata services reachable from inside a VM (AWS, GCP, Azure, OpenStack: the
# link-local one; AWS's IPv6; Alibaba Cloud's).
METADATA = (
    ipaddress.ip_network("169.254.169.254/32"),
    ipaddress.ip_network("fd00:ec2::254/128"),
    ipaddress.ip_network("100.100.100.200/32"),
)
SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: not public


def carried(ip: Address) -> Address:
    """The IPv4 address an IPv6 one carries (mapped ``::ffff:a.b.c.d``, compatible
    ``::a.b.c.d``, 6to4 ``2002:AABB:CCDD::``), else the address itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        packed = ip.packed
        if packed[:12] == bytes(12) and packed[12:] not in (bytes(4), b"\x00\x00\x00\x01"):
            return ipaddress.IPv4Address(packed[12:])  # ::a.b.c.d (deprecated, still routed)
    return ip


def why_refused(ip: Address) -> str | None:
    """Why a connection to ``ip`` is refused; None: it is a public address."""
    ip = carried(ip)
    if any(ip in net for net in METADATA):
        return "metadata"
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link_local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private or (isinstance(ip, ipaddress.IPv4Address) and ip in SHARED):
        return "private"
    if not ip.is_global:
        return "reserved"
    return None


@dataclass(frozen=True)
class AllowList:
    """Hosts (names, compared without case) and networks an operator allows."""

    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str], *, field: str = "tools.allow_hosts") -> AllowList:
        names, networks = set(), []
        for entry in entries:
            text = entry.strip()
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                if not text or "/" in text or " " in text:
                    raise ValueError(
                        f"{field}: {entry!r} is neither a host name nor a CIDR"
                    ) from None
                names.add(text.lower().rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def allows_name(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.names

    def allows(self, ip: Address) -> bool:
        return any(ip in net or carried(ip) in net for net in self.networks)


def refused(host: str, addresses: Iterable[Address], allow: AllowList) -> str | None:
    """Why ``host`` may not be reached at ``addresses`` (every one is checked: a name that
    resolves to one public and one private address is refused); None: it may."""
    if allow.allows_name(host):
        return None
    for ip in addresses:
        if allow.allows(ip):
            continue
        reason = why_refused(ip)
        if reason is not None:
            return reason
    return None
