"""Who is asking, as far as the sign-in lockout can tell (issue 45 §5).

Behind a reverse proxy every request comes from the proxy's address, and the client's is in
X-Forwarded-For, which the client can also write. The header is read only through the proxies
`TRUSTED_PROXIES` names: a count N (the last N hops were written by our proxies, so the client is the one
the outermost of them saw), or their networks (hops are skipped from the right while they are a trusted
proxy's; the first that is not is the client). A peer that is no trusted proxy is the client itself, whatever
it claims. Unset: REMOTE_ADDR alone.

An IPv6 client holds a whole /64 (one customer's network, or one host's privacy addresses), so it is
counted by that /64's first address; an IPv4-mapped address counts as the IPv4 address it is.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_MAX_HOPS = 32  # hops read from the right of X-Forwarded-For; a longer header is a client's own writing


def _address(raw: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(raw.strip())
    except ValueError:
        return None


def _peer(meta: Mapping[str, Any]) -> IPAddress | None:
    raw = meta.get("REMOTE_ADDR")
    return _address(raw) if isinstance(raw, str) else None


def _hops(meta: Mapping[str, Any]) -> list[str]:
    header = meta.get("HTTP_X_FORWARDED_FOR")
    if not isinstance(header, str) or not header:
        return []
    return [hop.strip() for hop in header.split(",")][-_MAX_HOPS:]


def client(meta: Mapping[str, Any]) -> IPAddress | None:
    """The client's address: REMOTE_ADDR, or the hop of X-Forwarded-For our trusted proxies vouch for."""
    peer = _peer(meta)
    count, networks = settings.TRUSTED_PROXY_COUNT, settings.TRUSTED_PROXY_NETWORKS
    if peer is None or not (count or networks):
        return peer
    hops = _hops(meta)
    if count:
        # Our N proxies appended N addresses; the outermost one's is the client. Fewer hops: the request did
        # not come through all of them, and what it carries proves nothing.
        return _address(hops[-count]) if len(hops) >= count and _address(hops[-count]) else peer
    trusted = [ipaddress.ip_network(network) for network in networks]

    def is_trusted(address: IPAddress) -> bool:
        return any(address in network for network in trusted)

    found = peer
    for hop in reversed(hops):
        if not is_trusted(found):
            return found
        address = _address(hop)
        if address is None:
            return found  # a hop no proxy of ours writes: the last trusted one is all we know
        found = address
    return found


def grouped(address: IPAddress) -> str:
    """The address as the lockout counts it: IPv4 as it is, IPv6 by its /64."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False).network_address)
    return str(address)
