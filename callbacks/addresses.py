"""Where a callback may go (SSRF guard; docs/security.md "Callbacks").

A customer names the URL, and our workers sit next to Postgres, Redis, RabbitMQ, Evolution and the
cloud's metadata service. So a URL is checked at registration and again before every attempt (its
DNS can change in between): every address its host resolves to must be a public unicast one, and the
attempt connects to an address that was checked, never resolves a second time (DNS rebinding).
CALLBACKS_ALLOW_PRIVATE_ADDRESSES lifts the address rule for development and tests only.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

SCHEMES = ("http", "https")
# Cloud metadata services that are not covered by the ranges below on every provider (AWS's IPv6
# one is a unique-local fd00::/8 address, which is private anyway; Alibaba's is ordinary-looking).
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("100.100.100.200"), ipaddress.ip_address("fd00:ec2::254")})
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data"})


class Refused(Exception):
    """The URL may not be called; `code` names why (the API's details carry it)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written (the TLS name and the Host header)
    port: int
    path: str  # path and query
    addresses: tuple[str, ...]  # every address the host resolved to, each checked


def parse(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of an absolute http(s) URL without credentials or fragment."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused("invalid_url", "The URL cannot be parsed.") from exc
    if parts.scheme not in SCHEMES:
        raise Refused("invalid_url", "The URL must start with http:// or https://.")
    if not parts.hostname:
        raise Refused("invalid_url", "The URL has no host.")
    if parts.username is not None or parts.password is not None:
        raise Refused("invalid_url", "The URL may not carry credentials.")
    if parts.fragment:
        raise Refused("invalid_url", "The URL may not carry a fragment.")
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):
        raise Refused("invalid_url", "The URL may not contain spaces or control characters.")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return is_public(address.ipv4_mapped)
    if address in METADATA_ADDRESSES:
        return False
    if (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    ):
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return False
    # is_global also leaves out shared address space (100.64.0.0/10) and the documentation ranges.
    return address.is_global


def resolve(host: str, port: int) -> tuple[str, ...]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Refused("unresolvable_host", f"The host {host!r} does not resolve.") from exc
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise Refused("unresolvable_host", f"The host {host!r} does not resolve.")
    return addresses


def check(url: str) -> Target:
    """The URL's target with every address checked, or Refused."""
    scheme, host, port, path = parse(url)
    guarded = not settings.CALLBACKS_ALLOW_PRIVATE_ADDRESSES
    if guarded and host.lower().rstrip(".") in METADATA_HOSTS:
        raise Refused("forbidden_address", "The URL names a cloud metadata service.")
    addresses = resolve(host, port)
    if guarded:
        for address in addresses:
            if not is_public(ipaddress.ip_address(address.split("%", 1)[0])):
                raise Refused(
                    "forbidden_address",
                    f"The host resolves to {address}, which is not a public address "
                    "(loopback, private, link-local, multicast, reserved and metadata addresses are refused).",
                )
    return Target(scheme, host, port, path, addresses)
