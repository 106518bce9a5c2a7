"""The outbox relay: move due work from Postgres to the lane queues (design.md §2).

`release_due` is one unit of work: it claims a batch of due outbox rows with SKIP LOCKED (so
several relays can run), publishes one task per row and deletes the rows in the same transaction.
If publishing fails the transaction rolls back and the rows wait for the next pass; if the relay
dies after publishing but before committing, a task is published twice and the worker's lease
claim turns the second into a no-op.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from pilot_status.celery import LANES, SEND_TASK, app

from .models import EventKind, Message, MessageEvent, OutboxEntry

log = logging.getLogger(__name__)


def release_due(limit: int = 200, lanes: tuple[str, ...] = LANES) -> int:
    """Publish up to `limit` due entries; returns how many were released."""
    now = timezone.now()
    with transaction.atomic():
        entries = list(
            OutboxEntry.objects.select_for_update(skip_locked=True)
            .filter(lane__in=lanes, available_at__lte=now)
            .order_by("-priority", "available_at", "pk")
            .values_list("pk", "message_id", "lane")[:limit]
        )
        if not entries:
            return 0
        with app.producer_or_acquire() as producer:
            for _, message_id, lane in entries:
                app.send_task(
                    SEND_TASK,
                    args=[str(message_id)],
                    queue=lane,
                    routing_key=lane,
                    producer=producer,
                )
        message_ids = [message_id for _, message_id, _ in entries]
        Message.objects.filter(pk__in=message_ids).update(dispatched_at=now)
        OutboxEntry.objects.filter(pk__in=[pk for pk, _, _ in entries]).delete()
        MessageEvent.objects.bulk_create(
            [
                MessageEvent(message_id=message_id, kind=EventKind.DISPATCHED, detail={"lane": lane}, created_at=now)
                for _, message_id, lane in entries
            ]
        )
    return len(entries)


def next_due_at() -> datetime | None:
    """When the earliest waiting entry becomes due (the relay sleeps until then at most)."""
    return OutboxEntry.objects.order_by("available_at").values_list("available_at", flat=True).first()


def release_all_due(limit: int = 200) -> int:
    """Release batches until nothing due is left; returns the total."""
    total = 0
    while True:
        released = release_due(limit)
        total += released
        if released < limit:
            return total


def close_connection_if_broken() -> None:
    # After a database outage Django keeps the dead connection until asked; drop it.
    if connection.connection is not None and not connection.is_usable():
        connection.close()
