"""The Redis fast path of two-layer dedup: one holder per event for two minutes (docs/internals.md, "Path of an event").

A lock is a filter, never the guard: the inbox's unique key and the row lock in
handlers.apply decide. So when Redis is unreachable the lock is treated as acquired and
ingestion carries on (docs/architecture.md, principle 3).

A holder that saw its event processed (committed) leaves a `done` mark in the lock's place for
another two minutes instead of deleting it: the other channel's copy, which usually arrives
within milliseconds, is then skipped on the lock's own round trip, without a database statement.
The mark only ever follows a commit, so it can make a copy skip work already done, never work
still to do; once it expires (or Redis loses it) the inbox answers as before.

One round trip to take the lock (a script around SET NX GET EX that also bumps the caller's
"skipped" counter when it finds the done mark) and one to give it back; every counter bumped in
this thread meanwhile (`metrics.batched`: the event's own and the message's status counters) rides
along with the release in the same pipeline. A copy skipped on the done mark costs one round trip.
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
# handler without keeping a crashed holder's lock for long.
LOCK_TTL_SECONDS = 120
# What a holder leaves when its event is processed; a lock token is 32 hex digits, never this.
DONE = b"done"
DONE_TTL_SECONDS = 120

# Take the lock, or tell who has it: nil when taken, else the holder's token or the done mark,
# in which case the copy is skipped and counted as such (KEYS[2]) in the same round trip.
_TAKE = (
    "local held = redis.call('set', KEYS[1], ARGV[1], 'NX', 'GET', 'EX', ARGV[2]) "
    "if held == ARGV[3] then redis.call('incrby', KEYS[2], 1) end return held"
)

# Delete the lock (or turn it into the done mark) only if it is still ours: a holder whose lock
# expired never touches the next holder's. EVAL, not EVALSHA: a pipeline would otherwise ask
# SCRIPT EXISTS first (one more trip).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
_RELEASE_DONE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('set', KEYS[1], ARGV[2], 'EX', ARGV[3]) end return 0"
)

_take: Any = None


class Hold:
    """What `event_lock` yields: true when this process may handle the event now.

    False either because another process holds the event right now, or because it is already
    processed (`done`): then the copy needs no work at all.
    """

    def __init__(self, acquired: bool, done: bool = False):
        self.acquired = acquired
        self.done = done
        self.finished = False

    def __bool__(self) -> bool:
        return self.acquired

    def finish(self) -> None:
        """The event is processed and committed: leave the done mark on release."""
        self.finished = True

    def count(self, name: str) -> None:
        """Bump `ps:metrics:evolution:<name>` (sent with the lock's release, like every count made
        while the lock is held)."""
        metrics.evolution(name)


@contextmanager
def event_lock(dedup_key: str, skipped_counter: str) -> Iterator[Hold]:
    """Yields a Hold, false when another process holds the event right now or has finished it.

    `skipped_counter` (an evolution counter name) is bumped by the lock itself when it finds the
    event done; the caller then only skips the copy.
    """
    global _take
    key = LOCK_PREFIX + dedup_key
    token = uuid.uuid4().hex
    client: Any = None
    try:
        client = metrics.redis()
        if _take is None:  # EVALSHA; redis-py's Script loads it again after a NOSCRIPT
            _take = client.register_script(_TAKE)
        held = _take(keys=[key, metrics.EVOLUTION + skipped_counter], args=[token, LOCK_TTL_SECONDS, DONE],
                     client=client)
    except Exception as exc:  # Redis down or slow: see module docstring
        log.debug("event lock unavailable (%s); relying on the inbox", exc)
        client, held = None, None
    hold = Hold(acquired=held is None, done=held == DONE)
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
        if hold.acquired and hold.finished:
            pipe.eval(_RELEASE_DONE, 1, key, token, DONE, DONE_TTL_SECONDS)
        elif hold.acquired:
            pipe.eval(_RELEASE, 1, key, token)
        metrics.send(pending, pipe)
        pipe.execute()
    except Exception as exc:  # Redis went away meanwhile: the lock expires, counts are lost
        log.debug("event lock release / counters failed (%s)", exc)
