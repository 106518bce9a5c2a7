"""Transitions that span models: failing into the dead-letter queue, waiting, retrying, sent.

Each is a compare-and-set on the message's status (and on the worker's lease where a worker acts),
so that two workers, a worker and a reconciler, or a replayed task can never both win.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import django.dispatch
from django.db import transaction
from django.utils import timezone

from pilot_status import observe

from . import writes
from .accept import enqueue
from .models import DeadLetter, EventKind, Message, Status

# Sent after a message's Evolution id is committed: receipts that raced ahead of the send
# (ingestion stores them) can now be applied. Ingestion listens; the domain does not import it.
message_sent = django.dispatch.Signal()


def _compare_and_set(
    message: Message, from_statuses: tuple[str, ...], lease_token: uuid.UUID | None, **fields: Any
) -> bool:
    """Change the row only if it is still in one of `from_statuses` (and, when a worker acts, still
    under that worker's lease); every such move also ends the lease."""
    rows = Message.objects.filter(pk=message.pk, status__in=from_statuses)
    if lease_token is not None:
        rows = rows.filter(lease_token=lease_token)
    fields.setdefault("updated_at", timezone.now())
    return bool(rows.update(lease_token=None, lease_expires_at=None, **fields))


def fail(
    message: Message,
    reason: str,
    detail: str,
    response: Any = None,
    from_statuses: tuple[str, ...] = (Status.QUEUED, Status.SENDING),
    lease_token: uuid.UUID | None = None,
    extra_update: dict[str, Any] | None = None,
) -> bool:
    """FAILED with a reason, a timeline entry and a dead letter, in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        changed = _compare_and_set(
            message,
            from_statuses,
            lease_token,
            hold_reason=None,
            status=Status.FAILED,
            failure_reason=reason,
            failure_detail=detail[:2000],
            failed_at=now,
            updated_at=now,
            last_gateway_response=response,
            **(extra_update or {}),
        )
        if not changed:
            return False
        message.refresh_from_db()
        message.record(EventKind.FAILED, reason=reason, detail=detail[:500])
        DeadLetter.objects.update_or_create(
            message=message,
            defaults={
                "project_id": message.project_id,
                "reason": reason,
                "detail": detail[:2000],
                "last_gateway_response": response,
                "attempts": message.attempts,
                "status": "OPEN",
                "resolved_by": "",
                "resolved_at": None,
            },
        )
        message.record(EventKind.DEAD_LETTERED, reason=reason)
    return True


def requeue(
    message: Message,
    lease_token: uuid.UUID | None,
    available_at: datetime,
    kind: str,
    detail: dict[str, Any],
    extra_update: dict[str, Any] | None = None,
) -> bool:
    """SENDING → QUEUED with a due time: a retry (the caller counts the attempt in
    `extra_update`) or a wait (no attempt used).

    A wait is a hold: it writes its WAITING line only when its reason differs from the hold the
    message was already in (`hold_reason`), and while it is held the relay writes no DISPATCHED line
    either, so a message held for hours has one line per change of reason, not two per cycle."""
    hold = hold_reason(kind, detail, extra_update)
    repeated = hold is not None and hold == message.hold_reason  # as claimed, under this lease
    with transaction.atomic():
        changed = _compare_and_set(
            message,
            (Status.SENDING,),
            lease_token,
            status=Status.QUEUED,
            next_attempt_at=available_at,
            # Not in the broker any more: the relay releases it again from the new outbox row.
            dispatched_at=None,
            hold_reason=hold,
            **(extra_update or {}),
        )
        if not changed:
            return False
        message.refresh_from_db()
        if not repeated:
            message.record(kind, next_attempt_at=available_at.isoformat(), **detail)
        enqueue(message, available_at)
    return True


def hold_reason(kind: str, detail: dict[str, Any], extra_update: dict[str, Any] | None) -> str | None:
    """What holds a message back, as one comparable string (why, and the instance or circuit it
    concerns), or None when this requeue is not a hold: a retry uses an attempt (the caller counts it
    in `extra_update`) and a recovery is no wait."""
    if kind != EventKind.WAITING or "attempts" in (extra_update or {}):
        return None
    parts = [str(detail.get("why", "")), str(detail.get("instance", "")), str(detail.get("circuit", ""))]
    return "|".join(parts)[:200]


def mark_sent(
    message: Message,
    lease_token: uuid.UUID | None,
    evolution_message_id: str,
    remote_jid: str,
    attempt_detail: dict[str, Any],
    extra_update: dict[str, Any] | None = None,
    attempt_line: writes.TimelineLine | None = None,
    from_statuses: tuple[str, ...] = (Status.SENDING,),
) -> bool:
    """SENDING → SENT, with the attempt that sent it (when given) and the status in the timeline:
    one statement, the hot path of every message."""
    now = timezone.now()
    changes: dict[str, Any] = {
        "status": Status.SENT,
        "sent_at": now,
        "updated_at": now,
        "evolution_message_id": evolution_message_id,
        "remote_jid": remote_jid,
        "last_gateway_response": attempt_detail,
        "lease_token": None,
        "lease_expires_at": None,
        "hold_reason": None,
        **(extra_update or {}),
    }
    status_line = writes.TimelineLine(
        EventKind.STATUS, {"status": Status.SENT, "evolutionMessageId": evolution_message_id}, now
    )
    lines = [attempt_line, status_line] if attempt_line else [status_line]
    if not writes.compare_and_set(message.pk, from_statuses, lease_token, changes, lines):
        if attempt_line is not None:
            # The lease was lost meanwhile, but the attempt did happen: the timeline keeps it.
            message.record(attempt_line.kind, **attempt_line.detail)
        return False
    created_at = message.__dict__.get("created_at")  # loaded by the claim; never a query of its own
    for name, value in changes.items():
        setattr(message, name, value)
    if created_at is not None:
        observe.observe(observe.ACCEPT_TO_SENT, message.lane, (now - created_at).total_seconds())
    message_sent.send(sender=Message, message=message)
    return True
