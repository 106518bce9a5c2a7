"""The OTP window: while an OTP is on its way from accept to SENT, background work waits for it.

Priorities (pilot_status.priority) give the OTP path our own processes' CPU first. But Postgres,
Redis, RabbitMQ and Evolution serve both at the same priority, and a marketing drain keeps them busy:
every hop of an OTP then queues behind the drain's statements and receipts (bench B3). So an OTP's
accept, and the OTP relay's release, open a short window in Redis (`OTP_WINDOW_MS`), and a unit of
background work that starts while it is open (a send of another lane, a pass of the bulk relay, an
event from a webhook or from the RabbitMQ consumer) first waits for it to close. A send of another lane
looks again just before its call to Evolution; an event looks when it takes its lock, in the same
round trip (ingestion.locks).

Bounded on both sides: one wait lasts one window at most, and a thread that has waited goes on
without looking for as long as it waited, so that OTP traffic however heavy slows the background by
half at most and never stops it (per thread: a lane worker runs its sends on a pool of threads, and
one thread's wait must not let the others skip theirs). Redis unreachable: the window counts as closed and opening it is skipped (both tried again a few seconds
later, pilot_status.redis_backoff); an OTP never fails because of it.
"""

from __future__ import annotations

import threading
import time

from django.conf import settings

from pilot_status import metrics
from pilot_status.celery import LANES
from pilot_status.redis_backoff import RedisBackoff

KEY = "ps:otp:window"
OTP_LANE = "otp"


def lane_waits(lane: str) -> bool:
    """Every lane but the OTP's is background work."""
    return lane in LANES and lane != OTP_LANE


_redis = RedisBackoff("OTP window neither opened nor looked at")
# `no_look_until`: this thread waited lately and does not look again before then (monotonic).
_waited = threading.local()


def _no_look_until() -> float:
    return float(getattr(_waited, "no_look_until", 0.0))


def open_window() -> None:
    """An OTP is on its way: ask the background to wait for `OTP_WINDOW_MS` (renewing an open window)."""
    window_ms = settings.OTP_WINDOW_MS
    if window_ms <= 0 or not _redis.ready():
        return
    try:
        metrics.redis().set(KEY, b"1", px=window_ms)
    except Exception as exc:  # Redis down or slow: an OTP goes on without its window
        _redis.failed(exc)


def window_to_look_at() -> str | None:
    """The window's Redis key when this process should look at it now; None when it should not (the
    window is off, this process waited lately, or Redis is away)."""
    if settings.OTP_WINDOW_MS <= 0 or time.monotonic() < _no_look_until() or not _redis.ready():
        return None
    return KEY


def wait_for_window(kind: str) -> float:
    """Background work of this `kind` (a counter label) is about to start: wait while an OTP's window is
    open. Returns the seconds waited."""
    key = window_to_look_at()
    if key is None:
        return 0.0
    try:
        left_ms = metrics.redis().pttl(key)
    except Exception as exc:
        _redis.failed(exc)
        return 0.0
    return yield_to(left_ms, kind)


def yield_to(left_ms: int | None, kind: str) -> float:
    """Wait out a window that a look found `left_ms` from closing (PTTL's answer: ≤ 0 or None when
    there is none), then go on without looking for as long. Returns the seconds waited.

    For a look that rides on another Redis call (ingestion.locks takes an event's lock with it)."""
    if left_ms is None or left_ms <= 0:  # -2: no window; -1 cannot happen (always set with a TTL)
        return 0.0
    wait = min(int(left_ms), settings.OTP_WINDOW_MS) / 1000
    time.sleep(wait)
    _waited.no_look_until = time.monotonic() + wait
    metrics.messages(f"otp_window:yielded:{kind}")
    return wait


def reset_local() -> None:
    """Forget this process's state (tests)."""
    global _waited
    _redis.reset()
    _waited = threading.local()
