"""The answer's application: what Evolution answered to one send (gateway.Outcome, real or a TEST number's simulated
one) recorded on the message: SENT, back to QUEUED (disconnected, misconfigured: no attempt used), a retry with
backoff, FAILED with a dead letter, or a lost answer to be asked about before the next send (sending.lost_answer).
Every write is compare-and-set on the claim's lease; an answer that comes after the lease was lost is still recorded.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from pilot_status import metrics

from .. import governor, lifecycle
from ..models import EventKind, FailureReason, Instance, Message, Status
from ..writes import TimelineLine
from . import backoff, evidence, gateway, instance_state, routing
from .lease import LEASE_LOST

log = logging.getLogger(__name__)

# A 401 from Evolution is our configuration, not the message's fault: wait, shout, burn nothing.
MISCONFIGURED_WAIT = timedelta(seconds=30)


def apply_outcome(
    message: Message, token: uuid.UUID, instance: Instance, outcome: gateway.Outcome, started: datetime | None = None
) -> str:
    now = timezone.now()
    record = outcome.as_record()
    metrics.messages(f"attempt:{outcome.kind}:{message.lane}")
    if outcome.kind == gateway.SENT:
        attempts = message.attempts + 1
        changes: dict[str, object] = {"attempts": attempts}
        if not outcome.extra.get("simulated"):
            note_id_honoured(message, instance, outcome.message_id)
        line = TimelineLine(EventKind.ATTEMPT, {"attempt": attempts, "instance": instance.name, **record}, now)
        if not lifecycle.mark_sent(message, token, outcome.message_id, outcome.remote_jid, record,
                                   extra_update=changes, attempt_line=line):
            if lifecycle.answer_after_receipts(message, token, outcome.message_id, outcome.remote_jid, record,
                                               extra_update=changes):
                return "sent"
            return _sent_after_losing_lease(message, outcome, record, changes)
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
        # A storm of these rests the number (messaging.governor).
        governor.safely(governor.connection_closed, instance.pk)
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
        # The send may have gone out: the next claim asks Evolution about this attempt's window first.
        since, until = evidence.window(started or now - timedelta(seconds=settings.EVOLUTION_READ_TIMEOUT + 5), now)
        extra.update(unconfirmed_attempt_at=since, unconfirmed_attempt_until=until,
                     outcome_unknown_since=message.outcome_unknown_since or now)
        retry_at = backoff.next_attempt_at(attempts, now, message.deliver_until)
        if attempts >= message.max_attempts or retry_at is None:
            # No try is left, but the message is failed only once Evolution was asked (resolve_lost_answer).
            retry_at = now
        # Never asked before Evolution has settled: "not found by our id" means "not sent" only then.
        retry_at = max(retry_at, evidence.settled_at(until))
        if not lifecycle.requeue(
            message, token, retry_at, EventKind.WAITING,
            detail={"why": "answer lost: Evolution is asked before anything else", "attempt": attempts},
            extra_update=extra,
        ):
            return _overtaken(message, token, {"attempts": attempts}, record)
        return "retry"
    if attempts >= message.max_attempts:
        if not lifecycle.fail(
            message, FailureReason.RETRIES_EXHAUSTED, f"{attempts} attempts failed; last: {outcome.detail}",
            record, lease_token=token, extra_update=extra,
        ):
            return _overtaken(message, token, extra, record)
        return "failed"
    retry_at = backoff.next_attempt_at(attempts, now, message.deliver_until)
    if retry_at is None:
        lifecycle.fail(
            message, FailureReason.EXPIRED, f"no retry fits before deliverUntil; last: {outcome.detail}",
            record, lease_token=token, extra_update=extra,
        )
        return "failed"
    if not lifecycle.requeue(
        message, token, retry_at, EventKind.WAITING,
        detail={"why": "retry after a transient failure", "attempt": attempts}, extra_update=extra,
    ):
        return _overtaken(message, token, extra, record)
    return "retry"


def _overtaken(message: Message, token: uuid.UUID, changes: dict[str, object], record: dict[str, object]) -> str:
    """A retry's write found the message moved on: receipts matched on its own id showed that the send went out
    while the answer was lost or an error. The attempt joins the message and its lease ends."""
    if lifecycle.answer_after_receipts(message, token, "", "", record, extra_update=changes):
        metrics.messages(f"answer_overtaken:{message.lane}")
        return "sent"
    return LEASE_LOST


def note_id_honoured(message: Message, instance: Instance, answered: str) -> None:
    """Whether the instance's Evolution sent with the id we chose, as its answer shows: kept on the instance
    (written only when it changes), and a mismatch logged. The answer's id is the one recorded either way."""
    asked = message.own_message_id
    if not asked or not answered:
        return
    honoured = answered == asked
    if not honoured:
        log.warning(
            "instance %s sent message %s as WhatsApp id %s, not the %s it was given (messageId): its Evolution "
            "ignores the field; lost answers on it are judged by inference", instance.name, message.pk, answered, asked,
        )
        metrics.evolution("gateway:message_id_ignored")
    if instance.honours_message_id is not honoured:
        Instance.objects.filter(pk=instance.pk).exclude(honours_message_id=honoured).update(honours_message_id=honoured)
        instance.honours_message_id = honoured


def _sent_after_losing_lease(
    message: Message, outcome: gateway.Outcome, record: dict[str, object], changes: dict[str, object]
) -> str:
    """Evolution sent it, but our lease was gone (the worker stalled past it and the reconciler took
    the message back). The send is the truth: record it while the message waits for another
    attempt; if another worker is already sending it, say so loudly."""
    metrics.messages(f"lease_lost:{message.lane}")
    if lifecycle.mark_sent(message, None, outcome.message_id, outcome.remote_jid, record,
                           extra_update=changes, from_statuses=(Status.QUEUED,)):
        log.error("message %s was sent after its lease ran out; recorded as SENT", message.pk)
    elif Message.objects.filter(pk=message.pk, status=Status.FAILED, lease_token__isnull=True).exists():
        # An ERROR receipt matched on its own id overtook the answer: WhatsApp refused what was sent.
        log.warning("message %s: sendText answered after WhatsApp's error for it; it stays FAILED", message.pk)
    else:
        log.error("message %s was sent after its lease ran out and another worker holds it: it may be sent twice",
                  message.pk)
    return LEASE_LOST


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
