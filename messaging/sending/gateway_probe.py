"""The round trip of Evolution's `GET /` as the kernel saw it: the gateway's queue, not this process's wait.

The adaptive limit (sending.gateway_limit) reads a probe's round trip above its base as the time a call
now waits in the gateway's queue. A lane worker runs niced among hundreds of threads, so a round trip
timed in Python also holds the time its thread waited for a CPU and for the GIL after the answer had
arrived. In bench B8 (3 s of latency, the simulator at nice -10) the probe read p50 2.5-10 ms against a
base of 0.6 ms while the simulator's event loop ran under 1 ms late (p50): the limit took the worker's
own wait for a queue at the gateway, and the lane sent a handful at a time for the first 10 s of a run.

Here the answer's arrival is the kernel's receive timestamp of its first packet (SO_TIMESTAMPNS), taken
when the packet arrives, whoever holds the CPU then; the request leaves right after the clock is read,
while this thread holds the GIL. No HTTP client exposes that timestamp, hence one plain HTTP/1.1 request
on a socket of its own (`Connection: close`; the connect is not timed). Where it cannot be had (an
https URL: a TLS socket has no recvmsg; a platform without SO_TIMESTAMPNS) `stamped` is False and the
caller times its own request, as before.
"""

from __future__ import annotations

import platform
import socket
import struct
import sys
import time
from urllib.parse import urlsplit


def _so_timestampns() -> int | None:
    """The option's number: Python's socket module does not name it. 35 is Linux's generic value
    (asm-generic/socket.h), which these architectures use; elsewhere the caller times its own request."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64", "arm64", "i686", "armv7l", "riscv64"):
        return None
    return getattr(socket, "SO_TIMESTAMPNS", 35)


SO_TIMESTAMPNS = _so_timestampns()
_TIMESPEC = struct.Struct("@ll")  # struct timespec: seconds, nanoseconds
_FIRST_PACKET = 4096


def stamped(url: str) -> bool:
    """Whether `round_trip` can time this URL by the kernel's clock."""
    return SO_TIMESTAMPNS is not None and urlsplit(url).scheme == "http"


def round_trip(url: str, connect_timeout: float, timeout: float) -> float | None:
    """Seconds from sending `GET <url>/` to its answer's first packet, as the kernel received it; `timeout`
    when no answer came in time; None when the gateway is not reachable or does not answer 200."""
    assert SO_TIMESTAMPNS is not None
    parts = urlsplit(url)
    request = (f"GET {parts.path.rstrip('/')}/ HTTP/1.1\r\nHost: {parts.netloc}\r\n"
               "Connection: close\r\n\r\n").encode("latin-1")
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=connect_timeout) as sock:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            # Blocking for the send: with a timeout, CPython polls first and takes the GIL back before it
            # sends, and the request would leave a switch interval after its clock was read.
            sock.settimeout(None)
            sent_at, started = time.time(), time.monotonic()
            sock.sendall(request)
            sock.settimeout(timeout)
            data, ancillary, _, _ = sock.recvmsg(_FIRST_PACKET, socket.CMSG_SPACE(_TIMESPEC.size))
            waited = time.monotonic() - started
    except TimeoutError:
        return timeout
    except OSError:
        return None
    if data[:7] != b"HTTP/1." or data[9:12] != b"200" or data[12:13] not in (b" ", b"\r"):
        return None
    arrived = _arrival(ancillary)
    if arrived is None or not 0 <= arrived - sent_at <= waited:
        return waited  # no stamp, or the wall clock stepped meanwhile: this thread's own timing
    return arrived - sent_at


def _arrival(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            return float(seconds + nanoseconds / 1e9)
    return None
