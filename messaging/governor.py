"""The health governor per number (docs/sending-policy.md, "Health governor"): it records the signals a number
gives, judges them with messaging.health's rules, and moves the number's health state.

- The signals are InstanceSignal rows written where the product learns them: a send to a cold contact
  (messaging.sending.turns, before the call), an ERROR receipt on such a send and a connection.update
  (ingestion.handlers), a send that met "Connection Closed" (the worker), an opt-out reply (messaging.opt_outs).
  The shares read the number's day (SendSchedule's count of sends; messaging.unacknowledged's flags).
- A change is a compare-and-set on the instance's row and an InstanceHealthEvent in one transaction, so two
  judges never record one change twice. The callback `instance.health` (callbacks.derive) and the dashboard read
  those rows; the gauge `pilot_status_instance_health` reads the instances.
- Each signal is judged at once for its number; `run_pass` (beat, HEALTH_PASS_SECONDS) judges what time moves: the
  end of a rest, of a ramp, of a cooling period, a logout that does not come back, the share of unacknowledged sends.
- An operator's override (admin) sets a state for HEALTH_OVERRIDE_SECONDS, logged with the operator's name.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from . import health
from .choices import ConnectionState, HealthState, Status
from .models import Instance, InstanceHealthEvent, InstanceSignal, Message, SendSchedule, SignalKind

log = logging.getLogger(__name__)

GOVERNOR = "governor"
# A storm of sends meeting "Connection Closed" counts as one disconnect per this many real seconds.
DISCONNECT_DEBOUNCE = timedelta(seconds=10)
LOGGED_OUT, FORBIDDEN = 401, 403


def scale() -> float:
    return float(settings.SENDING_POLICY_TIME_SCALE)


def limits() -> health.Thresholds:
    return health.Thresholds(
        window_s=settings.HEALTH_WINDOW_SECONDS, cold_errors=settings.HEALTH_COLD_ERRORS,
        cooling_s=settings.HEALTH_COOLING_SECONDS, unacked_share=settings.HEALTH_UNACKNOWLEDGED_SHARE,
        unacked_min_sends=settings.HEALTH_MIN_SENDS, disconnects=settings.HEALTH_DISCONNECTS,
        rest_s=settings.HEALTH_REST_SECONDS, ramp_s=settings.HEALTH_RAMP_SECONDS,
        opt_out_share=settings.HEALTH_OPT_OUT_SHARE, opt_out_min_sends=settings.HEALTH_MIN_SENDS,
        logout_restrict_s=settings.HEALTH_LOGOUT_RESTRICT_SECONDS,
        logouts_to_restrict=settings.HEALTH_LOGOUTS_TO_RESTRICT,
        logout_window_s=settings.HEALTH_LOGOUT_WINDOW_SECONDS, cap_factor=settings.HEALTH_AT_RISK_CAP_FACTOR,
    )


def cap_factor(state: str) -> float:
    return health.cap_factor(state, limits())


def policy_terms(state: str, cold_paused_until: datetime | None) -> dict[str, Any]:
    """What the sending policy (messaging.sending.policy.decide) reads of a number's health."""
    return {"health": state, "cap_factor": cap_factor(state), "cold_paused_until": cold_paused_until}


def standing(instance: Instance) -> health.Standing:
    return health.Standing(instance.health_state, instance.health_changed_at, instance.cold_paused_until,
                           instance.health_override_until)


# --- signals --------------------------------------------------------------------------------------------------


def note(instance_id: int, kind: str, at: datetime | None = None, message_id: uuid.UUID | None = None,
         **detail: Any) -> None:
    InstanceSignal.objects.create(instance_id=instance_id, kind=kind, at=at or timezone.now(),
                                  message_id=message_id, detail=detail)


def cold_send(instance_id: int, message_id: uuid.UUID) -> None:
    """A send to a cold contact is about to go out: an ERROR receipt on it will count against the number."""
    note(instance_id, SignalKind.COLD_SEND, message_id=message_id)


def error_receipt(message: Message) -> None:
    """WhatsApp reported an error (463) for this message: a strike if it went to a cold contact."""
    if not InstanceSignal.objects.filter(message_id=message.pk, kind=SignalKind.COLD_SEND,
                                         instance_id=message.instance_id).exists():
        return
    note(message.instance_id, SignalKind.COLD_ERROR, message_id=message.pk, to=message.to)
    evaluate(message.instance_id)


def connection(instance: Instance, state: str, reason: Any, changed: bool) -> None:
    """A connection.update was applied: remember its statusReason; leaving `open` is a disconnect, a close with
    401 a logout."""
    code = reason if isinstance(reason, int) and 0 <= reason < 32768 else None
    Instance.objects.filter(pk=instance.pk).update(connection_reason=code)
    if changed and state != ConnectionState.OPEN:
        note(instance.pk, SignalKind.DISCONNECT, state=state, statusReason=code)
        if state == ConnectionState.CLOSE and code == LOGGED_OUT:
            note(instance.pk, SignalKind.LOGOUT, statusReason=code)
    evaluate(instance.pk)


def connection_closed(instance_id: int) -> None:
    """A send met "Connection Closed": a disconnect, counted once per DISCONNECT_DEBOUNCE."""
    now = timezone.now()
    if InstanceSignal.objects.filter(instance_id=instance_id, kind=SignalKind.DISCONNECT,
                                     at__gt=now - DISCONNECT_DEBOUNCE).exists():
        return
    note(instance_id, SignalKind.DISCONNECT, now, source="send")
    evaluate(instance_id)


def opt_out(instance_name: str, phone: str) -> None:
    """A recipient replied with an opt-out keyword to this number: counted once per recipient and day, so that one
    person writing STOP again (or the same reply on both channels) is one opt-out."""
    instance_id = Instance.objects.filter(name=instance_name).values_list("pk", flat=True).first()
    if instance_id is None:
        return
    day = timezone.now() - health.real(86400.0, scale())
    if not InstanceSignal.objects.filter(instance_id=instance_id, kind=SignalKind.OPT_OUT, at__gte=day,
                                         detail__phone=phone).exists():
        note(instance_id, SignalKind.OPT_OUT, phone=phone)
    evaluate(instance_id)


def safely(signal: Callable[..., None], *args: Any) -> None:
    """Record a signal where the product learns it without letting a fault of the governor undo what the caller
    did (a receipt applied, an answer recorded): the signal's writes are a savepoint, and a fault is logged loudly.
    The next pass (run_pass) judges the number again."""
    try:
        with transaction.atomic():
            signal(*args)
    except Exception:
        log.exception("health signal %s%r not recorded", signal.__name__, args)


def signals(instance: Instance, now: datetime) -> health.Signals:
    """What the number did lately, for the rules."""
    rules = limits()
    window = now - health.real(rules.window_s, scale())
    logout_window = now - health.real(rules.logout_window_s, scale())
    rows = InstanceSignal.objects.filter(
        instance_id=instance.pk, at__gte=min(window, logout_window),
        kind__in=[SignalKind.COLD_ERROR, SignalKind.DISCONNECT, SignalKind.LOGOUT],
    ).values_list("kind", "at")
    times: dict[str, list[datetime]] = {SignalKind.COLD_ERROR: [], SignalKind.DISCONNECT: [], SignalKind.LOGOUT: []}
    for kind, at in rows:
        if kind == SignalKind.LOGOUT and at >= logout_window or kind != SignalKind.LOGOUT and at >= window:
            times[kind].append(at)
    day = SendSchedule.objects.filter(instance_id=instance.pk).values_list("day_started_at", "day_sent").first()
    day_start, sends = day if day and day[0] and day[0] > now - health.real(86400.0, scale()) else (None, 0)
    unacknowledged = opt_outs = 0
    if day_start is not None:
        # Written as msg_unacknowledged's condition, so that the count reads that partial index only.
        unacknowledged = Message.objects.filter(status=Status.SENT, unacknowledged_at__isnull=False,
                                                instance_id=instance.pk, sent_at__gte=day_start).count()
        opt_outs = InstanceSignal.objects.filter(instance_id=instance.pk, kind=SignalKind.OPT_OUT,
                                                 at__gte=day_start).count()
    closed = instance.connection_state == ConnectionState.CLOSE
    logged_out = closed and instance.connection_reason == LOGGED_OUT
    return health.Signals(
        sends=sends, unacknowledged=unacknowledged, opt_outs=opt_outs, cold_errors=times[SignalKind.COLD_ERROR],
        disconnects=times[SignalKind.DISCONNECT], logouts=times[SignalKind.LOGOUT],
        connected=instance.connection_state == ConnectionState.OPEN,
        logged_out_since=instance.state_changed_at if logged_out else None,
        banned=closed and instance.connection_reason == FORBIDDEN,
    )


# --- changes --------------------------------------------------------------------------------------------------


def evaluate(instance_id: int, now: datetime | None = None) -> list[InstanceHealthEvent]:
    """Judge the number's signals and apply the changes they call for (a rest that ends may ramp back at once)."""
    done: list[InstanceHealthEvent] = []
    for _ in range(3):
        instance = Instance.objects.filter(pk=instance_id).first()
        if instance is None:
            break
        at = now or timezone.now()
        change = health.judge(standing(instance), signals(instance, at), at, limits(), scale())
        if change is None:
            break
        event = _apply(instance, change.to, change.reason, change.evidence, change.cold_paused_until, GOVERNOR, at)
        if event is None:
            break  # another judge moved it meanwhile: its change stands
        done.append(event)
    return done


def _apply(instance: Instance, to: str, reason: str, evidence: dict[str, Any], cold_paused_until: datetime | None,
           actor: str, at: datetime, override_until: datetime | None = None) -> InstanceHealthEvent | None:
    """Move the number from the state it was read in, and record the change; None when it moved meanwhile."""
    with transaction.atomic():
        moved = Instance.objects.filter(
            Q(health_changed_at=instance.health_changed_at) if instance.health_changed_at
            else Q(health_changed_at__isnull=True),
            pk=instance.pk, health_state=instance.health_state,
        ).update(health_state=to, health_changed_at=at, cold_paused_until=cold_paused_until,
                 health_override_until=override_until)
        if not moved:
            return None
        event = InstanceHealthEvent.objects.create(
            instance_id=instance.pk, from_state=instance.health_state, to_state=to, reason=reason,
            evidence=evidence, actor=actor, cold_paused_until=cold_paused_until, at=at)
    log.warning("instance %s health %s -> %s (%s, %s)", instance.name, instance.health_state, to, reason, actor)
    return event


def override(instance: Instance, state: str, operator: str, note_text: str = "") -> InstanceHealthEvent | None:
    """An operator sets the number's state; it holds for HEALTH_OVERRIDE_SECONDS (a restriction until lifted).
    Healthy also ends a cooling period. Logged with the operator's name."""
    if state not in HealthState.values:
        raise ValueError(f"unknown health state {state!r}")
    now = timezone.now()
    instance.refresh_from_db()
    hold = now + health.real(float(settings.HEALTH_OVERRIDE_SECONDS), scale())
    paused = None if state == HealthState.HEALTHY else instance.cold_paused_until
    evidence = {"note": note_text} if note_text else {}
    return _apply(instance, state, health.OPERATOR, evidence, paused, f"operator:{operator}", now, override_until=hold)


def run_pass(now: datetime | None = None, limit: int = 1000) -> int:
    """Judge the numbers time may move, or with fresh signals; prune the signals no window reads. How many moved."""
    now = now or timezone.now()
    rules = limits()
    longest = max(rules.window_s, rules.logout_window_s, 86400.0)
    InstanceSignal.objects.filter(at__lt=now - health.real(longest, scale())).delete()
    since = now - health.real(rules.window_s, scale())
    day = now - health.real(86400.0, scale())
    ids = set(Instance.objects.exclude(health_state=HealthState.HEALTHY).values_list("pk", flat=True)[:limit])
    ids |= set(Instance.objects.filter(cold_paused_until__isnull=False).values_list("pk", flat=True)[:limit])
    ids |= set(Instance.objects.filter(connection_state=ConnectionState.CLOSE,
                                       connection_reason__in=[LOGGED_OUT, FORBIDDEN]).values_list("pk", flat=True)[:limit])
    ids |= set(InstanceSignal.objects.filter(at__gte=since).values_list("instance_id", flat=True).distinct()[:limit])
    ids |= set(Message.objects.filter(status=Status.SENT, unacknowledged_at__isnull=False, sent_at__gte=day)
               .values_list("instance_id", flat=True).distinct()[:limit])
    moved = 0
    for instance_id in sorted(ids):
        moved += len(evaluate(instance_id, now))
    return moved


def states() -> dict[str, str]:
    """Every instance's health state by name (the gauge)."""
    return dict(Instance.objects.values_list("name", "health_state"))
