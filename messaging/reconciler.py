"""The message reconciler (celery-beat): every stuck state has someone who finds it (docs/architecture.md, principle 6).

- a lease that expired (the worker died mid-send) → QUEUED, and the next attempt first checks
  whether the dead worker's send went out;
- a QUEUED message released to the broker that no worker ever claimed (the broker lost it) →
  released again;
- a QUEUED message past deliverUntil → FAILED EXPIRED with a dead letter;
- Idempotency-Key answers older than 24 h → deleted.
Each pass is bounded by a batch size per step and a time budget (RECONCILE_PASS_SECONDS, checked
between messages), so that a huge backlog or a slow database never makes one beat tick run into the
next: the next tick goes on where this one stopped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from . import lifecycle
from .accept import IDEMPOTENCY_TTL
from .models import EventKind, FailureReason, IdempotencyRecord, Message, OutboxEntry, Status
from .sending import evidence, human_pace
from .sending.lease import lease_seconds

# How long a released message may sit unclaimed before we assume the broker lost it. Generous
# for marketing, whose queue is deep by design; tight for OTP, whose 2-minute life is short.
LOST_DISPATCH_AFTER = {
    "otp": timedelta(seconds=15),
    "utility": timedelta(seconds=60),
    "marketing": timedelta(minutes=10),
}
BATCH = 500


@dataclass
class Report:
    leases_recovered: int = 0
    redispatched: int = 0
    expired: int = 0
    idempotency_pruned: int = 0

    @property
    def total(self) -> int:
        return self.leases_recovered + self.redispatched + self.expired


def _over(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


def _lost_lease_window(message: Message, now: datetime) -> dict[str, Any]:
    """A dead worker could only have sent while its lease ran (the lease outlives a claim's worst
    case, sending.budget): that span is the attempt's window, and its outcome is unknown."""
    assert message.lease_expires_at is not None
    since, until = evidence.window(
        message.lease_expires_at - timedelta(seconds=lease_seconds()), message.lease_expires_at
    )
    return {
        "unconfirmed_attempt_at": min(since, message.unconfirmed_attempt_at or since),
        "unconfirmed_attempt_until": until,
        "outcome_unknown_since": message.outcome_unknown_since or now,
    }


def recover_expired_leases(limit: int = BATCH, deadline: float | None = None) -> int:
    now = timezone.now()
    recovered = 0
    for message in Message.objects.filter(status=Status.SENDING, lease_expires_at__lt=now)[:limit]:
        if _over(deadline):
            break
        # The dead worker may have reached Evolution: mark the attempt unconfirmed.
        if lifecycle.requeue(
            message,
            message.lease_token,
            now,
            EventKind.RECOVERED,
            detail={"why": "lease expired (worker died or hung)"},
            extra_update=_lost_lease_window(message, now),
        ):
            recovered += 1
    return recovered


def redispatch_lost(limit: int = BATCH, deadline: float | None = None) -> int:
    now = timezone.now()
    released = 0
    for lane, after in LOST_DISPATCH_AFTER.items():
        candidates = (
            Message.objects.filter(
                status=Status.QUEUED,
                category=lane.upper(),
                dispatched_at__lt=now - after,
                next_attempt_at__lt=now - after,
                deliver_until__gt=now,
            )
            .exclude(pk__in=OutboxEntry.objects.values("message_id"))
            .order_by("next_attempt_at")[:limit]
        )
        for message in candidates:
            if _over(deadline):
                return released
            if lifecycle.redispatch(message, now):
                released += 1
    return released


def expire_overdue(limit: int = BATCH, deadline: float | None = None) -> int:
    now = timezone.now()
    expired = 0
    # A message whose last answer was lost is the lane worker's to decide (it asks Evolution first);
    # only if it has not within UNCONFIRMED_GRACE_SECONDS is it failed here, as unknown.
    grace = now - timedelta(seconds=settings.UNCONFIRMED_GRACE_SECONDS)
    overdue = Message.objects.filter(status=Status.QUEUED, deliver_until__lte=now).filter(
        Q(unconfirmed_attempt_at__isnull=True) | Q(deliver_until__lte=grace)
    )
    for message in overdue[:limit]:
        unknown = message.unconfirmed_attempt_at is not None
        if _over(deadline):
            break
        if lifecycle.expire(
            message,
            FailureReason.OUTCOME_UNKNOWN if unknown else FailureReason.EXPIRED,
            "deliverUntil passed; an answer from Evolution was lost and the message may have been delivered"
            if unknown else human_pace.deadline_detail(message.hold_reason),
            response=message.last_gateway_response,
        ):
            expired += 1
    return expired


def prune_idempotency(limit: int = 5000) -> int:
    cutoff = timezone.now() - IDEMPOTENCY_TTL
    ids = list(IdempotencyRecord.objects.filter(created_at__lt=cutoff).values_list("pk", flat=True)[:limit])
    return IdempotencyRecord.objects.filter(pk__in=ids).delete()[0]


def run_batch(budget_s: float | None = None) -> Report:
    """One pass of every step, within the time budget (expiry is the one an OTP's deadline needs
    most, but leases go first: a recovered lease may still make its deadline)."""
    deadline = time.monotonic() + (budget_s if budget_s is not None else settings.RECONCILE_PASS_SECONDS)
    report = Report(leases_recovered=recover_expired_leases(deadline=deadline))
    report.redispatched = redispatch_lost(deadline=deadline)
    report.expired = expire_overdue(deadline=deadline)
    if not _over(deadline):
        report.idempotency_pruned = prune_idempotency()
    return report
