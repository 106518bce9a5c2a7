"""The Redis fast path of two-layer dedup: one holder per event for two minutes (seeds B).

A lock is a filter, never the guard: the inbox's unique key and the row lock in
handlers.apply decide. So when Redis is unreachable the lock is treated as acquired and
ingestion carries on (design.md §3).

One round trip to take the lock (SET NX EX) and one to give it back; every counter bumped in this
thread meanwhile (`metrics.batched`: the event's own and the message's status counters) rides
along with the release in the same pipeline.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pilot_status import metrics

log = logging.getLogger(__name__)

LOCK_PREFIX = "ps:lock:evolution:"
# Both channels usually deliver within milliseconds of each other; two minutes covers a slow
# handler without keeping a crashed holder's lock for long (seeds B).
LOCK_TTL_SECONDS = 120

# Delete the lock only if it is still ours: a holder whose lock expired never deletes the next
# holder's. EVAL, not EVALSHA: a pipeline would otherwise ask SCRIPT EXISTS first (one more trip).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class Hold:
    """What `event_lock` yields: true when this process may handle the event now."""

    def __init__(self, acquired: bool):
        self.acquired = acquired

    def __bool__(self) -> bool:
        return self.acquired

    def count(self, name: str) -> None:
        """Bump `ps:metrics:evolution:<name>` (sent with the lock's release, like every count made
        while the lock is held)."""
        metrics.evolution(name)


@contextmanager
def event_lock(dedup_key: str) -> Iterator[Hold]:
    """Yields a Hold, false when another process holds the event right now."""
    key = LOCK_PREFIX + dedup_key
    token = uuid.uuid4().hex
    client: Any = None
    try:
        client = metrics.redis()
        acquired = bool(client.set(key, token, nx=True, ex=LOCK_TTL_SECONDS))
    except Exception as exc:  # Redis down or slow: see module docstring
        log.debug("event lock unavailable (%s); relying on the inbox", exc)
        client, acquired = None, True
    hold = Hold(acquired)
    pending: list[tuple[str, int]] = []
    try:
        with metrics.batched() as pending:
            yield hold
    finally:
        _give_back(client, key, token, hold, pending)


def _give_back(client: Any, key: str, token: str, hold: Hold, pending: list[tuple[str, int]]) -> None:
    if client is None:  # no lock was taken; the counters are best effort as always
        for name, amount in pending:
            metrics.incr(name, amount)
        return
    if not hold.acquired and not pending:
        return
    try:
        pipe = client.pipeline(transaction=False)
        if hold.acquired:
            pipe.eval(_RELEASE, 1, key, token)
        metrics.send(pending, pipe)
        pipe.execute()
    except Exception as exc:  # Redis went away meanwhile: the lock expires, counts are lost
        log.debug("event lock release / counters failed (%s)", exc)
