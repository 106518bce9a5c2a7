"""What the worker believes about an instance's connection, and releasing the messages it held.

`current` asks Evolution's connectionState at most once per `INSTANCE_STATE_CACHE_SECONDS` per
instance (cached in Redis, or in this process when Redis is down), so smart wait costs one cached
read per send. Any state we learn is written to the Instance row; a change to `open` releases
the instance's waiting messages at once (the relay paces them). `poll_waiting` is the beat task's
safety net for a lost `connection.update` webhook.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.utils import timezone

from pilot_status import metrics
from pilot_status.database import release_while_waiting

from ..models import ConnectionState, Instance, Message, OutboxEntry, Status
from . import gateway

log = logging.getLogger(__name__)

_KEY = "ps:instance-state:{}"
_STATES = {s.value for s in ConnectionState}
_local: dict[str, tuple[str, float, float]] = {}


def _cached(name: str) -> tuple[str, float] | None:
    """(state, epoch when learnt) or None."""
    try:
        value = metrics.redis().get(_KEY.format(name))
    except Exception:
        local_state, until, learnt_at = _local.get(name, ("", 0.0, 0.0))
        return (local_state, learnt_at) if until > time.monotonic() else None
    if value is None:
        return None
    state, _, learnt = (value.decode() if isinstance(value, bytes) else value).partition("|")
    return state, float(learnt or 0)


def remember(name: str, state: str, ttl: float | None = None) -> None:
    ttl = ttl or settings.INSTANCE_STATE_CACHE_SECONDS
    _local[name] = (state, time.monotonic() + ttl, time.time())
    try:
        metrics.redis().set(_KEY.format(name), f"{state}|{time.time()!r}", px=max(1, int(ttl * 1000)))
    except Exception:
        pass


def current(instance: Instance) -> str | None:
    """open / connecting / close / missing, or None when Evolution could not tell us."""
    cached = _cached(instance.name)
    # A webhook (connection.update) recorded on the row after we cached wins over the cache.
    if cached and cached[1] >= instance.state_changed_at.timestamp():
        return cached[0]
    if cached and instance.connection_state == ConnectionState.OPEN:
        return ConnectionState.OPEN
    # A lane thread asks Evolution without holding a pooled connection: when a cached state expires,
    # every thread sending through that instance asks at once, and held connections starved the claims.
    release_while_waiting()
    state = gateway.connection_state(instance.name)
    if state is None:
        return None
    remember(instance.name, state)
    if state in _STATES and state != instance.connection_state:
        # Only a change is written: the thread gave its pooled connection back for the call, and taking one again
        # just to write what the row holds could time out on a busy pool and fail the task after its claim.
        sync(instance, state)
    return state


def sync(instance: Instance, state: str) -> bool:
    """Record a state learnt from Evolution; a change to open releases the waiting messages."""
    changed = instance.set_connection_state(state)
    if changed:
        log.info("instance %s is now %s", instance.name, state)
        metrics.messages(f"instance_state:{state}")
        if state == ConnectionState.OPEN:
            release_waiting(instance)
    return changed


def release_waiting(instance: Instance) -> int:
    """Make the instance's waiting messages due now. The relay releases them at the instance's pace."""
    now = timezone.now()
    return OutboxEntry.objects.filter(
        message__instance=instance, message__status=Status.QUEUED, available_at__gt=now
    ).update(available_at=now)


# One poll must end before the next tick (beat period INSTANCE_POLL_SECONDS, 15 s) even when
# Evolution is slow: checked between instances.
POLL_BUDGET_SECONDS = 10.0


def poll_waiting(limit: int = 50, budget_s: float = POLL_BUDGET_SECONDS) -> int:
    """Ask Evolution about instances we believe are down and that hold queued messages."""
    started = time.monotonic()
    waiting = (
        Instance.objects.exclude(connection_state=ConnectionState.OPEN)
        .filter(pk__in=Message.objects.filter(status=Status.QUEUED).values("instance_id"))
        .order_by("state_changed_at")[:limit]
    )
    released = 0
    for instance in waiting:
        if time.monotonic() - started > budget_s:
            break
        state = gateway.connection_state(instance.name)
        if state in _STATES:
            remember(instance.name, state)
            if sync(instance, state) and state == ConnectionState.OPEN:
                released += 1
    return released
