"""Where a callback may go (SSRF guard; docs/security.md "Callbacks").

A customer names the URL, and our workers sit next to Postgres, Redis, RabbitMQ, Evolution and the
cloud's metadata service. So a URL is checked at registration and again before every attempt (its
DNS can change in between): every address its host resolves to must be a public unicast one, and the
attempt connects to an address that was checked, never resolves a second time (DNS rebinding).
Ports are 80, 443 and CALLBACKS_EXTRA_PORTS: a tenant cannot aim us at a third party's SSH, SMTP or
database port. CALLBACKS_ALLOW_PRIVATE_ADDRESSES lifts the address and port rules for development and the
test stacks only (production mode refuses it: pilot_status.production).

Looking a host up is bounded (issue 45 §3): the system's resolver runs in a thread of its own and is
given CALLBACKS_RESOLVE_SECONDS; a name server that never answers costs the request (a web worker, a
delivery thread) that long, never the resolver's own timeouts. A lookup that overran goes on in its
thread until the resolver gives up; while it does, its project's next lookups are refused at once (so a
tenant pointing at its own silent name server cannot hold the workers), and past
CALLBACKS_RESOLVE_OVERDUE_MAX of them in a process every lookup is. Other projects look up as usual.

A refusal says one thing to the tenant (GENERIC_REFUSAL): no address, and no difference between a host
that does not resolve and one that resolves where it may not, which would map our network's names. What
was found goes to the server's log.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

SCHEMES = ("http", "https")
# Cloud metadata services that are not covered by the ranges below on every provider (AWS's IPv6
# one is a unique-local fd00::/8 address, which is private anyway; Alibaba's is ordinary-looking).
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("100.100.100.200"), ipaddress.ip_address("fd00:ec2::254")})
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data"})
DEFAULT_PORTS = (80, 443)
GENERIC_REFUSAL = "The URL may not be called: its host must resolve to public addresses only."

log = logging.getLogger(__name__)


class Refused(Exception):
    """The URL may not be called; `code` and `message` are what the tenant is told, `details` what the
    API's error adds to them."""

    def __init__(self, code: str, message: str, details: dict[str, object] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}


def _forbidden(url: str, why: str) -> Refused:
    log.info("callback URL %r refused: %s", url, why)
    return Refused("forbidden_address", GENERIC_REFUSAL)


def allowed_ports() -> list[int]:
    return sorted({*DEFAULT_PORTS, *settings.CALLBACKS_EXTRA_PORTS})


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


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


class _Lookups:
    """The lookups of this process that overran their deadline and are still running, per owner."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.overdue: Counter[str] = Counter()
        self.running = 0
        self.idle = threading.Condition(self.lock)

    def refusal(self, owner: str) -> str | None:
        with self.lock:
            if self.overdue[owner]:
                return f"a lookup of this project's is still running past {settings.CALLBACKS_RESOLVE_SECONDS:g} s"
            if sum(self.overdue.values()) >= settings.CALLBACKS_RESOLVE_OVERDUE_MAX:
                return f"{sum(self.overdue.values())} lookups of this process are still running past their deadline"
            self.running += 1
            return None

    def overran(self, owner: str) -> None:
        with self.lock:
            self.overdue[owner] += 1

    def ended(self, owner: str, was_overdue: bool) -> None:
        with self.lock:
            self.running -= 1
            if was_overdue:
                self.overdue[owner] -= 1
                if not self.overdue[owner]:
                    del self.overdue[owner]
            self.idle.notify_all()


_lookups = _Lookups()


def wait_for_lookups(seconds: float) -> bool:
    """True once no lookup of this process is running (tests end theirs before the next one starts)."""
    with _lookups.lock:
        return _lookups.idle.wait_for(lambda: _lookups.running == 0, seconds)


def resolve(host: str, port: int, owner: str = "") -> tuple[str, ...]:
    """Every address of `host`, or () when it does not resolve within CALLBACKS_RESOLVE_SECONDS (or its
    owner's last lookup is still running past its own)."""
    literal = _literal(host)
    if literal is not None:
        return (str(literal),)  # nothing to ask a name server
    refusal = _lookups.refusal(owner)
    if refusal is not None:
        log.warning("callback host %r not looked up: %s", host, refusal)
        return ()
    found: list[tuple[str, ...]] = []
    done = threading.Event()
    state = {"overdue": False}
    state_lock = threading.Lock()

    def look_up() -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            found.append(tuple(dict.fromkeys(str(info[4][0]) for info in infos)))
        except (OSError, UnicodeError) as exc:
            log.info("callback host %r does not resolve: %s", host, exc)
        finally:
            with state_lock:
                done.set()
                overdue = state["overdue"]
            _lookups.ended(owner, overdue)

    started = time.monotonic()
    threading.Thread(target=look_up, name="callback-lookup", daemon=True).start()
    if not done.wait(settings.CALLBACKS_RESOLVE_SECONDS):
        with state_lock:
            if not done.is_set():
                state["overdue"] = True
                _lookups.overran(owner)
        if state["overdue"]:
            log.warning("callback host %r: no answer from the name server within %.1f s", host, time.monotonic() - started)
            return ()
    return found[0] if found else ()


def check(url: str, owner: str = "") -> Target:
    """The URL's target with every address checked, or Refused. `owner` (a project's id) is whose lookups
    wait for an overdue one (above)."""
    scheme, host, port, path = parse(url)
    guarded = not settings.CALLBACKS_ALLOW_PRIVATE_ADDRESSES
    if guarded:
        if host.lower().rstrip(".") in METADATA_HOSTS:
            raise _forbidden(url, "a cloud metadata service's name")
        literal = _literal(host)
        if literal is not None and not is_public(literal):
            raise _forbidden(url, f"{host} is not a public address")
        if port not in allowed_ports():
            # Before any lookup: a port that may never be called costs no name server a question.
            ports = allowed_ports()
            raise Refused("forbidden_port", f"The URL's port must be one of {', '.join(map(str, ports))}.",
                          {"allowedPorts": ports})
    addresses = resolve(host, port, owner)
    if not addresses:
        raise _forbidden(url, f"{host!r} does not resolve")
    if guarded:
        for address in addresses:
            if not is_public(ipaddress.ip_address(address.split("%", 1)[0])):
                raise _forbidden(url, f"{host!r} resolves to {address}, which is not a public address")
    return Target(scheme, host, port, path, addresses)
