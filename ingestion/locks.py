"""The Redis fast path of two-layer dedup: one holder per event for two minutes (seeds B).

A lock is a filter, never the guard: the inbox's unique key and the row lock in
handlers.apply decide. So when Redis is unreachable the lock is treated as acquired and
ingestion carries on (design.md §3).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import LockError

from pilot_status import metrics

log = logging.getLogger(__name__)

LOCK_PREFIX = "ps:lock:evolution:"
# Both channels usually deliver within milliseconds of each other; two minutes covers a slow
# handler without keeping a crashed holder's lock for long (seeds B).
LOCK_TTL_SECONDS = 120


@contextmanager
def event_lock(dedup_key: str) -> Iterator[bool]:
    """Yields False when another process holds the event right now, True otherwise."""
    lock = None
    try:
        # redis-py's Lock releases with a token check (Lua), so a holder whose lock expired
        # never deletes the next holder's lock.
        lock = metrics.redis().lock(LOCK_PREFIX + dedup_key, timeout=LOCK_TTL_SECONDS, blocking=False)
        acquired = bool(lock.acquire())
    except Exception as exc:  # Redis down or slow: see module docstring
        log.debug("event lock unavailable (%s); relying on the inbox", exc)
        lock, acquired = None, True
    try:
        yield acquired
    finally:
        if lock is not None and acquired:
            try:
                lock.release()
            except (LockError, Exception):  # expired, or Redis went away meanwhile
                pass
