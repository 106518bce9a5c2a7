"""One POST to a checked address (callbacks.addresses): the TCP connection goes to the address that
was checked, while the Host header, TLS's server name and certificate check use the URL's host."""

from __future__ import annotations

import time
from dataclasses import dataclass

import urllib3
from django.conf import settings

from .addresses import Target


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
    pool: urllib3.HTTPConnectionPool
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            address, target.port, timeout=timeout, retries=False, maxsize=1,
            server_hostname=target.host, assert_hostname=target.host,
        )
    else:
        pool = urllib3.HTTPConnectionPool(address, target.port, timeout=timeout, retries=False, maxsize=1)
    started = time.monotonic()
    limit = settings.CALLBACKS_RESPONSE_BODY_BYTES
    try:
        response = pool.urlopen(
            "POST", target.path, body=body, headers={**headers, "Host": host_header},
            redirect=False, preload_content=False, assert_same_host=False,
        )
        try:
            # Only the first bytes are read: a receiver cannot make us hold a large answer.
            text = response.read(limit).decode("utf-8", "replace") if limit else ""
        finally:
            response.release_conn()
        return Answer(response.status, text, _since(started), "", address)
    except Exception as exc:  # refused, timeout, TLS, a malformed answer: a failed attempt, logged as such
        return Answer(None, "", _since(started), f"{type(exc).__name__}: {exc}"[:300], address)
    finally:
        pool.close()


def _since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
