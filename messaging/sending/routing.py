"""Before a send: may it go now, through which instance, or how long must it wait?

`choose` returns a Route (send through this instance) or a Hold (put the message back with a due
time, no attempt used). It holds when the gateway's circuit is open, and when the message's
instance is not connected or has an open circuit and no fallback may take it. A fallback is the
next open instance by priority that the contract allows for this message (rules.fallback_instances);
re-routing is a compare-and-set on the worker's lease and leaves a REROUTED line in the timeline.
A message whose client named its instance explicitly is never re-routed: that choice is theirs.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.utils import timezone

from pilot_status import metrics

from .. import rules
from ..models import ConnectionState, EventKind, Instance, Message, Status
from . import breaker, instance_state

# How long a message waits before re-checking an instance that is not connected. No attempt is
# used; a connection.update to open or the state poll releases it earlier; deliverUntil bounds it.
DISCONNECTED_WAIT = {
    "otp": timedelta(seconds=5),
    "utility": timedelta(seconds=15),
    "marketing": timedelta(seconds=30),
}
NOT_CONNECTED = "instance not connected"
CIRCUIT_OPEN = "circuit open"


@dataclass(frozen=True)
class Route:
    instance: Instance
    # Both circuits (gateway, instance) were closed when checked: a success is fed back in one go.
    circuits_closed: bool = False


@dataclass(frozen=True)
class Hold:
    until: datetime
    why: str
    detail: dict[str, Any] = field(default_factory=dict)


def _epoch(value: float) -> datetime:
    # A little spread so that a held crowd does not come back in the same millisecond.
    return datetime.fromtimestamp(value + random.uniform(0, 1), tz=dt_timezone.utc)


def _not_connected(state: str | None) -> bool:
    return state in (ConnectionState.CONNECTING, ConnectionState.CLOSE)


def usable(instance: Instance, circuit_open_until: Any = breaker.LOOK_UP) -> tuple[bool, str, dict[str, Any]]:
    """Is this instance fit to send through right now? Takes the half-open probe when offered."""
    state = instance_state.current(instance)
    if _not_connected(state):
        return False, NOT_CONNECTED, {"instance": instance.name, "state": state}
    verdict = breaker.check(breaker.instance_scope(instance.name), until=circuit_open_until)
    if not verdict.allowed:
        return False, CIRCUIT_OPEN, {"instance": instance.name, "circuit": "instance", "retry_at": verdict.retry_at}
    return True, "", {}


def choose(message: Message, token: uuid.UUID) -> Route | Hold:
    now = timezone.now()
    instance = message.instance
    scope = breaker.instance_scope(instance.name)
    circuits = breaker.open_untils([breaker.GATEWAY, scope])
    gateway_verdict = breaker.check(breaker.GATEWAY, until=circuits[breaker.GATEWAY])
    if not gateway_verdict.allowed:
        assert gateway_verdict.retry_at is not None
        return Hold(_epoch(gateway_verdict.retry_at), CIRCUIT_OPEN, {"circuit": "gateway"})
    ok, why, detail = usable(instance, circuits[scope])
    if ok:
        return Route(instance, circuits_closed=all(until is None for until in circuits.values()))
    if not message.requested_instance:
        candidate = _fallback(message, instance)
        if candidate is not None and reroute(message, token, candidate, why):
            return Route(candidate)
    if gateway_verdict.probe:
        breaker.record(breaker.GATEWAY, breaker.NEUTRAL)  # the probe did not get to run
    if why == CIRCUIT_OPEN:
        until = _epoch(detail.pop("retry_at"))
    else:
        until = now + DISCONNECTED_WAIT[message.lane]
    return Hold(min(until, message.deliver_until), why, detail)


def _fallback(message: Message, current: Instance) -> Instance | None:
    opted_in = rules.has_live_opt_in(message.project, message.environment, message.to)
    for candidate in rules.fallback_instances(message.project, message.category, opted_in, exclude=[current.pk]):
        if breaker.is_open(breaker.instance_scope(candidate.name)):
            continue
        ok, _, _ = usable(candidate)
        if ok:
            return candidate
    return None


def has_fallback(message: Message) -> bool:
    """Whether a re-route is possible right now (used to retry a disconnected send at once)."""
    if message.requested_instance:
        return False
    # The same test the next claim will apply: an instance also known to be down is no fallback.
    return _fallback(message, message.instance) is not None


def reroute(message: Message, token: uuid.UUID, target: Instance, why: str) -> bool:
    previous = message.instance
    changed = Message.objects.filter(pk=message.pk, status=Status.SENDING, lease_token=token).update(
        instance=target, updated_at=timezone.now()
    )
    if not changed:
        return False
    message.instance = target
    message.record(EventKind.REROUTED, **{"from": previous.name, "to": target.name, "why": why})
    metrics.messages(f"rerouted:{message.lane}")
    return True
