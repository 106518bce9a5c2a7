"""Active status sync (seeds A-D): ask Evolution about messages whose receipts never came.

A webhook lost during a deploy must not leave a delivered message SENT forever. Forward only:
the answer can only move a message ahead, never back.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from . import lifecycle
from .models import FailureReason, Message, Status
from .sending import gateway

EVOLUTION_TO_STATUS = {
    "SERVER_ACK": Status.SERVER_ACK,
    "DELIVERY_ACK": Status.DELIVERED,
    "READ": Status.READ,
    "PLAYED": Status.READ,
}
ORDER = [Status.SERVER_ACK, Status.DELIVERED, Status.READ]
BATCH = 200


def stale_after() -> timedelta:
    return timedelta(seconds=getattr(settings, "STATUS_SYNC_AFTER_SECONDS", 120))


def sync_one(message: Message) -> bool:
    rows = gateway.find_status_messages(message.instance.name, message.evolution_message_id)
    if not rows:
        return False
    statuses = {str(row.get("status")) for row in rows}
    if "ERROR" in statuses:
        return lifecycle.fail(
            message,
            FailureReason.REJECTED,
            "WhatsApp reported an error (found by status sync)",
            response={"findStatusMessage": sorted(statuses)},
            from_statuses=(Status.SENT, Status.SERVER_ACK),
        )
    best = None
    for status in statuses:
        target = EVOLUTION_TO_STATUS.get(status)
        if target and (best is None or ORDER.index(target) > ORDER.index(best)):
            best = target
    if best is None:
        return False
    return message.advance(best, source="status_sync")


def run_batch(limit: int = BATCH) -> int:
    cutoff = timezone.now() - stale_after()
    updated = 0
    candidates = (
        Message.objects.filter(status__in=[Status.SENT, Status.SERVER_ACK], sent_at__lt=cutoff)
        .exclude(evolution_message_id="")
        .select_related("instance")
        .order_by("sent_at")[:limit]
    )
    for message in candidates:
        if sync_one(message):
            updated += 1
    return updated
