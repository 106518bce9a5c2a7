"""One POST to a checked address (callbacks.addresses): the TCP connection goes to the address that
was checked, while the Host header, TLS's server name and certificate check use the URL's host.

Connections are kept alive between deliveries, in one pool per (scheme, checked address, port, TLS host):
a connection per delivery cost a TCP (and TLS) handshake each time and left a socket in TIME_WAIT for a
minute on our side, so a few hundred callbacks a second to one receiver would use up the ephemeral ports.
A pooled connection only ever reaches an address that was checked for the delivery that uses it.

An attempt has a hard total deadline (issue 45 §2): the read timeout applies to each read, so a receiver
that drips a byte every few seconds would hold the thread for as long as it likes (and Celery's threads
pool ignores task time limits). One watchdog thread per process shuts the socket of any attempt still
going at its deadline; the blocked read then fails, the attempt is a failure like a timeout (the circuit
and auto-disable count it), and the connection is closed, never pooled again.
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import urllib3
from django.conf import settings
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from .addresses import Target

# At most this many receivers' pools per process (the least recently used goes), each keeping at most
# _KEPT_PER_POOL idle connections: a worker holds a bounded number of sockets whatever the endpoints.
_POOLS = 32
_KEPT_PER_POOL = 8
_manager: urllib3.PoolManager | None = None
_manager_pid = 0
_manager_lock = threading.Lock()


@dataclass
class _Watched:
    """One attempt under the watchdog: the connection it sends on, and whether its deadline passed."""

    deadline: float
    conn: Any = None
    expired: bool = False
    done: bool = False
    sequence: int = field(default_factory=itertools.count().__next__)


_current = threading.local()  # the attempt this thread is making


class _Watchdog:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, _Watched]] = []
        self._pid = 0

    def watch(self, deadline: float) -> _Watched:
        watched = _Watched(deadline)
        with self._lock:
            if self._pid != os.getpid():  # a forked child starts its own thread
                self._pid = os.getpid()
                self._due = []
                threading.Thread(target=self._run, name="callback-deadlines", daemon=True).start()
            heapq.heappush(self._due, (deadline, watched.sequence, watched))
            self._lock.notify()
        return watched

    def unwatch(self, watched: _Watched) -> bool:
        """Stop watching; True when the deadline had already cut the attempt."""
        with self._lock:
            watched.done = True
            return watched.expired

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._due and self._due[0][2].done:
                    heapq.heappop(self._due)
                if not self._due:
                    self._lock.wait()
                    continue
                deadline, _, watched = self._due[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._lock.wait(wait)
                    continue
                heapq.heappop(self._due)
                watched.expired = True
                sock = getattr(watched.conn, "sock", None)
                if sock is None:
                    # Still connecting (within its own timeout): cut it as soon as it has a socket.
                    heapq.heappush(self._due, (time.monotonic() + 0.05, watched.sequence, watched))
                    continue
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once
                except OSError:
                    pass


_watchdog = _Watchdog()


class _WatchedHTTPConnection(HTTPConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        watched = getattr(_current, "watched", None)
        if watched is not None:
            watched.conn = self
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        watched = getattr(_current, "watched", None)
        if watched is not None:
            watched.conn = self
        super().request(*args, **kwargs)


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


def _pools() -> urllib3.PoolManager:
    global _manager, _manager_pid
    with _manager_lock:
        if _manager is None or _manager_pid != os.getpid():  # a forked child opens its own sockets
            _manager = urllib3.PoolManager(num_pools=_POOLS, maxsize=_KEPT_PER_POOL, block=False)
            _manager.pool_classes_by_scheme = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}
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


def post(target: Target, body: bytes, headers: dict[str, str], deadline: float | None = None) -> Answer:
    """POST `body`; the whole exchange ends by `deadline` (time.monotonic(); default
    CALLBACKS_ATTEMPT_SECONDS from now), or the attempt is a failure."""
    address = target.addresses[0]
    started = time.monotonic()
    if deadline is None:
        deadline = started + settings.CALLBACKS_ATTEMPT_SECONDS
    left = max(0.001, deadline - started)
    timeout = urllib3.Timeout(connect=min(settings.CALLBACKS_CONNECT_TIMEOUT_SECONDS, left),
                              read=min(settings.CALLBACKS_TIMEOUT_SECONDS, left))
    default_port = 443 if target.scheme == "https" else 80
    host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
    if ":" in target.host and not target.host.startswith("["):
        host_header = f"[{target.host}]" if target.port == default_port else f"[{target.host}]:{target.port}"
    tls = {"server_hostname": target.host, "assert_hostname": target.host} if target.scheme == "https" else None
    limit = settings.CALLBACKS_RESPONSE_BODY_BYTES
    watched = _watchdog.watch(deadline)
    _current.watched = watched
    try:
        pool = _pools().connection_from_host(address, target.port, target.scheme, pool_kwargs=tls)
        response = pool.urlopen(
            "POST", target.path, body=body, headers={**headers, "Host": host_header}, timeout=timeout,
            redirect=False, preload_content=False, assert_same_host=False, retries=False,
        )
        try:
            # Only the first bytes are read: a receiver cannot make us hold a large answer.
            text = response.read(limit).decode("utf-8", "replace") if limit else ""
            expired = _watchdog.unwatch(watched)
            if expired or response.length_remaining != 0:
                # Cut by the deadline, or more answer than we read, or of unknown length: the connection
                # cannot carry the next request, so it is closed rather than read to its end.
                response.close()
        finally:
            response.release_conn()
        if expired:
            return Answer(None, "", _since(started), _cut(response.status), address)
        return Answer(response.status, text, _since(started), "", address)
    except Exception as exc:  # refused, timeout, TLS, a malformed answer: a failed attempt, logged as such
        if _watchdog.unwatch(watched):
            return Answer(None, "", _since(started), _cut(None), address)
        return Answer(None, "", _since(started), f"{type(exc).__name__}: {exc}"[:300], address)
    finally:
        _current.watched = None


def _cut(status: int | None) -> str:
    answered = f" (HTTP {status} came, its body did not)" if status is not None else ""
    return (f"DeadlineExceeded: the answer did not arrive within CALLBACKS_ATTEMPT_SECONDS="
            f"{settings.CALLBACKS_ATTEMPT_SECONDS:g}{answered}")


def _since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
