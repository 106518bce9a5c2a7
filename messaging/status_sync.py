"""Active status sync: ask Evolution about messages whose receipts never came.

A webhook lost during a deploy must not leave a delivered message SENT forever. Forward only:
the answer can only move a message ahead, never back.

Every pass advances (issue 22): it takes the messages never checked first, then the least recently
checked, stamps each one it asked about (whatever the answer, so a message Evolution cannot answer
for never holds the head of the line), looks at one again no sooner than STATUS_SYNC_AFTER_SECONDS,
and gives up STATUS_SYNC_GIVE_UP_AFTER_HOURS after the send with a SYNC_STOPPED timeline line (the
message keeps its status). A pass ends at STATUS_SYNC_PASS_SECONDS or after three answers in a row
that could not be had (Evolution down): the next tick goes on from there.

Each pass first flags the sends WhatsApp never acknowledged within ACK_TIMEOUT_SECONDS (messaging.unacknowledged)
and asks about those before any other.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from . import lifecycle, unacknowledged
from .models import FailureReason, Message, Status
from .sending import gateway

log = logging.getLogger(__name__)

EVOLUTION_TO_STATUS = {
    "SERVER_ACK": Status.SERVER_ACK,
    "DELIVERY_ACK": Status.DELIVERED,
    "READ": Status.READ,
    "PLAYED": Status.READ,
}
ORDER = [Status.SERVER_ACK, Status.DELIVERED, Status.READ]
BATCH = 200
# Evolution is down or refusing us: stop asking, the next tick tries again.
MAX_CONSECUTIVE_FAILURES = 3
AWAITING = (Status.SENT, Status.SERVER_ACK)

ADVANCED, UNCHANGED, CANNOT_TELL = "advanced", "unchanged", "cannot_tell"


def stale_after() -> timedelta:
    return timedelta(seconds=getattr(settings, "STATUS_SYNC_AFTER_SECONDS", 120))


def give_up_after() -> timedelta:
    return timedelta(hours=getattr(settings, "STATUS_SYNC_GIVE_UP_AFTER_HOURS", 72))


def check_one(message: Message) -> str:
    """Ask Evolution about one message: ADVANCED (moved forward or failed on an ERROR receipt),
    UNCHANGED (nothing newer than what we know) or CANNOT_TELL (no answer)."""
    if not message.evolution_message_id:  # nothing to ask by: it waits for its give-up
        return UNCHANGED
    rows = gateway.find_status_messages(message.instance.name, message.evolution_message_id)
    if rows is None:
        return CANNOT_TELL
    statuses = {str(row.get("status")) for row in rows}
    if "ERROR" in statuses:
        failed = lifecycle.fail(
            message,
            FailureReason.REJECTED,
            "WhatsApp reported an error (found by status sync)",
            response={"findStatusMessage": sorted(statuses)},
            from_statuses=AWAITING,
        )
        return ADVANCED if failed else UNCHANGED
    best = None
    for status in statuses:
        target = EVOLUTION_TO_STATUS.get(status)
        if target and (best is None or ORDER.index(target) > ORDER.index(best)):
            best = target
    if best is None:
        return UNCHANGED
    return ADVANCED if lifecycle.advance(message, best, source="status_sync") else UNCHANGED


def sync_one(message: Message) -> bool:
    """True when Evolution's answer moved the message (kept for callers of the one-message check)."""
    return check_one(message) == ADVANCED


def candidates(now: datetime, limit: int) -> list[Message]:
    """The sends WhatsApp never acknowledged first (messaging.unacknowledged; index msg_unacknowledged), then the
    others: never checked first (oldest send first), then the least recently checked; each at least
    STATUS_SYNC_AFTER_SECONDS after its send and after its last check (index msg_status_sync)."""
    cutoff = now - stale_after()
    due = Q(status_checked_at__isnull=True) | Q(status_checked_at__lt=cutoff)
    order = (F("status_checked_at").asc(nulls_first=True), "sent_at")
    first = list(
        Message.objects.filter(status=Status.SENT, unacknowledged_at__isnull=False, status_sync_stopped_at__isnull=True)
        .filter(due).select_related("instance").order_by(*order)[:limit]
    )
    if len(first) >= limit:
        return first
    return first + list(
        Message.objects.filter(status__in=AWAITING, status_sync_stopped_at__isnull=True, sent_at__lt=cutoff)
        .filter(due).exclude(pk__in=[m.pk for m in first])
        .select_related("instance")
        .order_by(*order)[: limit - len(first)]
    )


def stop_checking(message: Message, now: datetime) -> bool:
    """The give-up: stamp it and write its one SYNC_STOPPED line, in one statement."""
    hours = give_up_after().total_seconds() / 3600
    return lifecycle.stop_status_sync(message, now, f"no receipt {hours:g} h after the send: status sync stopped asking")


def run_batch(limit: int = BATCH, budget_s: float | None = None) -> int:
    """One pass; returns how many messages Evolution's answers moved forward."""
    budget = budget_s if budget_s is not None else settings.STATUS_SYNC_PASS_SECONDS
    started = time.monotonic()
    now = timezone.now()
    horizon = now - give_up_after()
    unacknowledged.flag(now)  # before the candidates: they come first
    updated = failures = 0
    for message in candidates(now, limit):
        outcome = check_one(message)
        failures = failures + 1 if outcome == CANNOT_TELL else 0
        if outcome == ADVANCED:
            updated += 1
            if message.status in AWAITING:  # SENT → SERVER_ACK: still waiting for a delivery
                Message.objects.filter(pk=message.pk).update(status_checked_at=timezone.now())
        elif message.sent_at is not None and message.sent_at <= horizon:
            stop_checking(message, timezone.now())
        else:
            Message.objects.filter(pk=message.pk).update(status_checked_at=timezone.now())
        # Checked after a message, so that every pass gets at least one done.
        if time.monotonic() - started > budget or failures >= MAX_CONSECUTIVE_FAILURES:
            log.info("status sync: pass ended early (%.1f s, %d failures in a row)", time.monotonic() - started, failures)
            break
    return updated
