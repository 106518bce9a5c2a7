"""One POST to a checked address (callbacks.addresses): the TCP connection goes to the address that
was checked, while the Host header, TLS's server name and certificate check use the URL's host.

Connections are kept alive between deliveries, in one pool per (scheme, checked address, port, TLS host):
a connection per delivery cost a TCP (and TLS) handshake each time and left a socket in TIME_WAIT for a
minute on our side, so a few hundred callbacks a second to one receiver would use up the ephemeral ports.
A pooled connection only ever reaches an address that was checked for the delivery that uses it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import urllib3
from django.conf import settings

from .addresses import Target

# At most this many receivers' pools per process (the least recently used goes), each keeping at most
# _KEPT_PER_POOL idle connections: a worker holds a bounded number of sockets whatever the endpoints.
_POOLS = 32
_KEPT_PER_POOL = 8
_manager: urllib3.PoolManager | None = None
_manager_pid = 0
_manager_lock = threading.Lock()


def _pools() -> urllib3.PoolManager:
    global _manager, _manager_pid
    with _manager_lock:
        if _manager is None or _manager_pid != os.getpid():  # a forked child opens its own sockets
            _manager = urllib3.PoolManager(num_pools=_POOLS, maxsize=_KEPT_PER_POOL, block=False)
            _manager_pid = os.getpid()
        return _manager


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no HTTP answer (refused, timeout, TLS)
    body: str  # the first CALLBACKS_RESPONSE_BODY_BYTES, decoded leniently
    duration_ms: int
    error: str
    address: str

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def post(target: Target, body: bytes, headers: dict[str, str]) -> Answer:
    address = target.addresses[0]
    timeout = urllib3.Timeout(connect=settings.CALLBACKS_CONNECT_TIMEOUT_SECONDS, read=settings.CALLBACKS_TIMEOUT_SECONDS)
    default_port = 443 if target.scheme == "https" else 80
    host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
    if ":" in target.host and not target.host.startswith("["):
        host_header = f"[{target.host}]" if target.port == default_port else f"[{target.host}]:{target.port}"
    tls = {"server_hostname": target.host, "assert_hostname": target.host} if target.scheme == "https" else None
    started = time.monotonic()
    limit = settings.CALLBACKS_RESPONSE_BODY_BYTES
    try:
        pool = _pools().connection_from_host(address, target.port, target.scheme, pool_kwargs=tls)
        response = pool.urlopen(
            "POST", target.path, body=body, headers={**headers, "Host": host_header}, timeout=timeout,
            redirect=False, preload_content=False, assert_same_host=False, retries=False,
        )
        try:
            # Only the first bytes are read: a receiver cannot make us hold a large answer.
            text = response.read(limit).decode("utf-8", "replace") if limit else ""
            if response.length_remaining != 0:
                # More answer than we read, or of unknown length: the connection cannot carry the next
                # request, so it is closed rather than read to its end.
                response.close()
        finally:
            response.release_conn()
        return Answer(response.status, text, _since(started), "", address)
    except Exception as exc:  # refused, timeout, TLS, a malformed answer: a failed attempt, logged as such
        return Answer(None, "", _since(started), f"{type(exc).__name__}: {exc}"[:300], address)


def _since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
