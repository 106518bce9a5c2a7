"""One send attempt for one message: claim the lease, ask the gateway, record what happened.

`send_one` is the whole unit of work behind the lane task; it is safe to run twice (the second
run finds nothing to claim) and returns what it did, so tests call it directly.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from pilot_status import metrics
from pilot_status.database import checking_connection

from .. import lifecycle, otp_window, writes
from ..models import EventKind, FailureReason, Instance, Message, Status
from . import backoff, breaker, gateway, instance_state, pacing, routing

log = logging.getLogger(__name__)

# A 401 from Evolution is our configuration, not the message's fault: wait, shout, burn nothing.
MISCONFIGURED_WAIT = timedelta(seconds=30)

CLAIMED = "claimed"
NOTHING_TO_CLAIM = "nothing_to_claim"


def claim(message_id: str) -> tuple[Message, uuid.UUID] | None:
    """QUEUED → SENDING with a lease; None when another worker has it or it is not due."""
    now = timezone.now()
    token = uuid.uuid4()
    # The claim doubles as the task's connection health check (one round trip less per send). Run
    # again on a replaced connection it is still safe: had the first one committed, the second finds
    # nothing to claim and the lease's expiry hands the message back (as after a crash).
    message = checking_connection(lambda: writes.claim(
        message_id,
        token,
        now,
        # One second of slack for clock skew between the relay's host and this one.
        due_by=now + timedelta(seconds=1),
        lease_until=now + timedelta(seconds=settings.SEND_LEASE_SECONDS),
    ))
    return None if message is None else (message, token)


def typing_delay_ms(text: str) -> int:
    return min(len(text) * settings.TYPING_DELAY_MS_PER_CHAR, settings.TYPING_DELAY_MAX_MS)


def send_one(message_id: str) -> str:
    claimed = claim(message_id)
    if claimed is None:
        return NOTHING_TO_CLAIM
    message, token = claimed
    now = timezone.now()
    if message.deliver_until <= now:
        lifecycle.fail(
            message, FailureReason.EXPIRED, "deliverUntil passed before a send succeeded", lease_token=token
        )
        return "expired"

    if message.unconfirmed_attempt_at is not None:
        found = _check_unconfirmed(message, token)
        if found is not None:
            return found

    route = routing.choose(message, token)
    if isinstance(route, routing.Hold):
        metrics.messages(f"held:{route.why.replace(' ', '_')}:{message.lane}")
        lifecycle.requeue(
            message, token, route.until, EventKind.WAITING,
            detail={"why": route.why, **route.detail},
        )
        return "held"

    instance = route.instance
    if otp_window.lane_waits(message.lane):
        otp_window.wait_for_window(f"send:{message.lane}")
    if not take_send_slot(message, token, route):
        return "held"
    outcome = gateway.send_text(instance.name, message.to, message.text, typing_delay_ms(message.text))
    if outcome.kind == gateway.SENT and route.circuits_closed:
        # Recorded after the SENT is: the breakers' round trip is not part of an OTP's accept → SENT.
        done = apply_outcome(message, token, instance, outcome)
        breaker.record_successes([breaker.instance_scope(instance.name), breaker.GATEWAY])
        return done
    feed_breakers(instance, outcome)
    return apply_outcome(message, token, instance, outcome)


def take_send_slot(message: Message, token: uuid.UUID, route: routing.Route) -> bool:
    """Wait for the instance's next send slot (sending.pacing); False when it is too far away and the
    message went back to Postgres, due at that slot, with no attempt used."""
    instance = route.instance
    wait = pacing.send_slot(instance.pk, instance.send_rate_per_second)
    if wait < 0:
        if not route.circuits_closed:  # a half-open circuit's probe this send took does not get to run
            breaker.record(breaker.instance_scope(instance.name), breaker.NEUTRAL)
            breaker.record(breaker.GATEWAY, breaker.NEUTRAL)
        metrics.messages(f"held:paced:{message.lane}")
        lifecycle.requeue(
            message, token, min(timezone.now() + timedelta(seconds=-wait), message.deliver_until), EventKind.WAITING,
            detail={"why": "instance send rate", "instance": instance.name, "waitSeconds": round(-wait, 3)},
        )
        return False
    if wait:
        time.sleep(wait)
    return True


def feed_breakers(instance: Instance, outcome: gateway.Outcome) -> None:
    """The instance circuit counts every transient answer; the gateway's only Evolution being unreachable."""
    scope = breaker.instance_scope(instance.name)
    if outcome.kind in (gateway.SENT, gateway.PERMANENT):
        breaker.record(scope, breaker.OK)
        breaker.record(breaker.GATEWAY, breaker.OK)
    elif outcome.kind in (gateway.TRANSIENT, gateway.UNKNOWN):
        breaker.record(scope, breaker.FAIL)
        unreachable = outcome.status_code is None or outcome.status_code in (502, 503, 504)
        breaker.record(breaker.GATEWAY, breaker.FAIL if unreachable else breaker.OK)
    else:  # disconnected / misconfigured: says nothing about Evolution's health
        breaker.record(scope, breaker.NEUTRAL)
        breaker.record(breaker.GATEWAY, breaker.OK if outcome.kind == gateway.DISCONNECTED else breaker.NEUTRAL)


def _check_unconfirmed(message: Message, token: uuid.UUID) -> str | None:
    """A previous answer was lost: if Evolution did send it, record SENT instead of sending again."""
    assert message.unconfirmed_attempt_at is not None
    try:
        record = gateway.find_sent_message(
            message.instance.name, message.to, message.text, message.unconfirmed_attempt_at.timestamp()
        )
    except gateway.CannotTell as exc:
        retry_at = timezone.now() + timedelta(seconds=backoff.delay_for(1))
        if retry_at >= message.deliver_until:
            lifecycle.fail(message, FailureReason.EXPIRED, f"could not confirm the last attempt: {exc}", lease_token=token)
            return "expired"
        lifecycle.requeue(
            message, token, retry_at, EventKind.WAITING,
            detail={"why": "cannot confirm whether the last attempt was sent", "error": str(exc)[:300]},
        )
        return "waiting"
    if record is None:
        return None
    key = record.get("key") or {}
    lifecycle.mark_sent(
        message, token, str(key.get("id", "")), str(key.get("remoteJid", "")),
        {"outcome": "sent", "confirmedBy": "findMessages"},
        extra_update={"unconfirmed_attempt_at": None},
    )
    return "confirmed_sent"


def apply_outcome(message: Message, token: uuid.UUID, instance: Instance, outcome: gateway.Outcome) -> str:
    now = timezone.now()
    record = outcome.as_record()
    metrics.messages(f"attempt:{outcome.kind}:{message.lane}")
    if outcome.kind == gateway.SENT:
        attempts = message.attempts + 1
        lifecycle.mark_sent(
            message, token, outcome.message_id, outcome.remote_jid, record,
            extra_update={"attempts": attempts, "unconfirmed_attempt_at": None},
            attempt_line=writes.TimelineLine(
                EventKind.ATTEMPT, {"attempt": attempts, "instance": instance.name, **record}, now
            ),
        )
        if instance.last_gateway_error:
            Instance.objects.filter(pk=instance.pk).update(last_gateway_error="", last_gateway_error_at=None)
        return "sent"

    if outcome.kind == gateway.DISCONNECTED:
        # A Connection Closed answer is fresher evidence than connectionState, which can still
        # say `open` over a dead socket: believe it for the lane's whole smart wait, or every
        # waiting message would be sent again (and refused) each time the short cache expires.
        wait_seconds = routing.DISCONNECTED_WAIT[message.lane].total_seconds()
        instance_state.sync(instance, "close")
        # After sync: the cache must be at least as new as the row's state change to count.
        instance_state.remember(instance.name, "close", ttl=max(settings.INSTANCE_STATE_CACHE_SECONDS, wait_seconds))
        # With an open fallback the next claim re-routes at once; otherwise wait for a reconnect.
        wait = timedelta(0) if routing.has_fallback(message) else routing.DISCONNECTED_WAIT[message.lane]
        lifecycle.requeue(
            message, token, min(now + wait, message.deliver_until), EventKind.WAITING,
            detail={"why": routing.NOT_CONNECTED, "instance": instance.name, **record},
        )
        return "waiting"

    if outcome.kind == gateway.MISCONFIGURED:
        report_misconfiguration(instance, outcome)
        lifecycle.requeue(
            message, token, min(now + MISCONFIGURED_WAIT, message.deliver_until), EventKind.WAITING,
            detail={"why": "gateway configuration fault", **record},
        )
        return "waiting"

    attempts = message.attempts + 1
    message.record(EventKind.ATTEMPT, attempt=attempts, instance=instance.name, **record)
    if outcome.kind == gateway.PERMANENT:
        lifecycle.fail(
            message, outcome.reason or FailureReason.REJECTED, outcome.detail, record,
            lease_token=token, extra_update={"attempts": attempts},
        )
        return "failed"

    # transient or unknown: an attempt is used; retry later if one fits.
    extra: dict[str, object] = {"attempts": attempts}
    if outcome.kind == gateway.UNKNOWN:
        extra["unconfirmed_attempt_at"] = now - timedelta(seconds=settings.EVOLUTION_READ_TIMEOUT + 5)
    if attempts >= message.max_attempts:
        lifecycle.fail(
            message, FailureReason.RETRIES_EXHAUSTED, f"{attempts} attempts failed; last: {outcome.detail}",
            record, lease_token=token, extra_update=extra,
        )
        return "failed"
    retry_at = backoff.next_attempt_at(attempts, now, message.deliver_until)
    if retry_at is None:
        lifecycle.fail(
            message, FailureReason.EXPIRED, f"no retry fits before deliverUntil; last: {outcome.detail}",
            record, lease_token=token, extra_update=extra,
        )
        return "failed"
    lifecycle.requeue(
        message, token, retry_at, EventKind.WAITING,
        detail={"why": "retry after a transient failure", "attempt": attempts}, extra_update=extra,
    )
    return "retry"


def report_misconfiguration(instance: Instance, outcome: gateway.Outcome) -> None:
    """Loud on purpose: an error log, a counter, and the instance's row in admin."""
    log.error(
        "Evolution refused our request for instance %s (HTTP %s: %s): check EVOLUTION_API_KEY / the instance token",
        instance.name, outcome.status_code, outcome.detail,
    )
    metrics.evolution("gateway:misconfigured")
    Instance.objects.filter(pk=instance.pk).update(
        last_gateway_error=f"HTTP {outcome.status_code}: {outcome.detail}"[:500], last_gateway_error_at=timezone.now()
    )
