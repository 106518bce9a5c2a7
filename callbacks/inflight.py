"""Slots for attempts in flight, per endpoint and per project, shared by every callbacks worker (Redis).

The delivery threads are shared by every tenant: without a cap, one tenant's slow receivers would hold all
of them and every other tenant's callbacks would wait (issue 45 §2). An attempt takes a slot of its
endpoint and one of its project (CALLBACKS_INFLIGHT_PER_ENDPOINT, CALLBACKS_INFLIGHT_PER_PROJECT) before it
posts, and gives both back after; one that finds either full is held a moment without using an attempt
(callbacks.deliver), and its thread goes on to the next task.

A slot is a member of a sorted set scored by when it lapses (the attempt's deadline plus a margin), so a
worker that dies holding one loses it by itself. While Redis is away, attempts go without slots: the per
attempt deadline still bounds each one, and an outage of Redis must not stop every callback.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from django.conf import settings

from pilot_status import metrics

log = logging.getLogger(__name__)

PREFIX = "ps:callbacks:inflight:"
MARGIN_SECONDS = 30

# KEYS endpoint set, project set; ARGV now, lapses at, member, endpoint cap, project cap, ttl ms.
# Returns 0 (taken), 1 (the endpoint's slots are full) or 2 (the project's are).
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 1 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 2 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return 0
"""
_script = None


@dataclass(frozen=True)
class Slot:
    endpoint_id: str
    project_id: str
    member: str  # "" when taken without Redis


def _keys(endpoint_id: str, project_id: str) -> list[str]:
    return [f"{PREFIX}endpoint:{endpoint_id}", f"{PREFIX}project:{project_id}"]


def take(endpoint_id: str, project_id: str) -> Slot | str:
    """A slot, or why not: "endpoint" or "project" (its slots are all in flight)."""
    global _script
    lifetime = settings.CALLBACKS_ATTEMPT_SECONDS + settings.CALLBACKS_RESOLVE_SECONDS + MARGIN_SECONDS
    member = uuid.uuid4().hex
    now = time.time()
    try:
        if _script is None:
            _script = metrics.redis().register_script(_TAKE)
        full = int(_script(
            keys=_keys(endpoint_id, project_id),
            args=[now, now + lifetime, member, settings.CALLBACKS_INFLIGHT_PER_ENDPOINT,
                  settings.CALLBACKS_INFLIGHT_PER_PROJECT, int(lifetime * 1000)],
        ))
    except Exception as exc:
        log.warning("callback slots unavailable (%s); attempting without one", exc)
        return Slot(endpoint_id, project_id, "")
    if full:
        return "endpoint" if full == 1 else "project"
    return Slot(endpoint_id, project_id, member)


def give_back(slot: Slot) -> None:
    if not slot.member:
        return
    try:
        pipe = metrics.redis().pipeline(transaction=False)
        for key in _keys(slot.endpoint_id, slot.project_id):
            pipe.zrem(key, slot.member)
        pipe.execute()
    except Exception as exc:  # it lapses by itself
        log.warning("callback slot not given back (%s); it lapses in %d s", exc, MARGIN_SECONDS)


def in_flight(endpoint_id: str, project_id: str) -> tuple[int, int]:
    """(the endpoint's, the project's) slots taken and not lapsed."""
    now = time.time()
    client = metrics.redis()
    return tuple(int(client.zcount(key, now, "+inf")) for key in _keys(endpoint_id, project_id))  # type: ignore[return-value]
