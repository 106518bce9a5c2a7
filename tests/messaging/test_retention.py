"""Retention (issue 22): old timeline lines of finished messages and old processed inbox rows are
pruned in small batches; everything a person or a reconciler still needs stays."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.utils import timezone

from ingestion import retention as inbox_retention
from ingestion.models import IngestionEvent
from messaging import lifecycle, retention
from messaging.models import DeadLetter, FailureReason, Message, MessageEvent
from tests.messaging.sending_helpers import queue


def aged(actor: Any, status: str, days: int = 100, **fields: Any) -> Message:
    [message_id] = queue(actor, "UTILITY", 1)
    message = Message.objects.get(pk=message_id)
    if status == "FAILED":
        lifecycle.fail(message, FailureReason.REJECTED, "refused", from_statuses=("QUEUED",))
    Message.objects.filter(pk=message_id).update(status=status, **fields)
    message.record("STATUS", status=status)
    MessageEvent.objects.filter(message_id=message_id).update(created_at=timezone.now() - timedelta(days=days))
    return message


def lines(message: Message) -> int:
    return MessageEvent.objects.filter(message=message).count()


def test_old_lines_of_finished_messages_go_and_the_rest_stay(alice: Any, alice_instance: Any, settings: Any) -> None:
    settings.TIMELINE_RETENTION_DAYS = 90
    delivered = aged(alice, "DELIVERED")
    read = aged(alice, "READ")
    recent = aged(alice, "DELIVERED", days=10)
    waiting = aged(alice, "SENT")  # status sync still asks about it
    given_up = aged(alice, "SENT", status_sync_stopped_at=timezone.now())
    open_letter = aged(alice, "FAILED")  # a person still has to look at it
    dismissed = aged(alice, "FAILED")
    DeadLetter.objects.filter(message=dismissed).update(status="DISMISSED")

    assert retention.prune_timelines() > 0
    for gone in (delivered, read, given_up, dismissed):
        assert lines(gone) == 0, gone.status
        assert Message.objects.filter(pk=gone.pk).exists()  # the message itself still answers
    for kept in (recent, waiting, open_letter):
        assert lines(kept) > 0, kept.status


def test_timelines_go_in_batches_and_a_pass_keeps_to_its_budget(alice: Any, alice_instance: Any, settings: Any) -> None:
    settings.TIMELINE_RETENTION_DAYS = 90
    messages = [aged(alice, "DELIVERED") for _ in range(3)]
    total = sum(lines(m) for m in messages)
    assert retention.prune_timelines(batch=2, budget_s=0) == 2  # one statement, then out of time
    assert retention.prune_timelines(batch=2) == total - 2  # the rest, two at a time
    assert sum(lines(m) for m in messages) == 0


def inbox_row(days: int, processed: bool) -> IngestionEvent:
    at = timezone.now() - timedelta(days=days)
    return IngestionEvent.objects.create(
        dedup_key=uuid.uuid4().hex + uuid.uuid4().hex, channel="WEBHOOK", event="messages.upsert",
        payload={"event": "messages.upsert", "data": {"message": {"conversation": "hello"}}},
        received_at=at, processed_at=at if processed else None,
    )


def test_old_processed_inbox_rows_go_unprocessed_ones_stay(db: Any, settings: Any) -> None:
    settings.INBOX_RETENTION_DAYS = 30
    old_done = [inbox_row(31, processed=True) for _ in range(3)]
    old_pending = inbox_row(31, processed=False)  # the reconciler still owes it a forward
    recent = inbox_row(5, processed=True)
    assert inbox_retention.prune_inbox(batch=2) == 3
    left = set(IngestionEvent.objects.values_list("pk", flat=True))
    assert left == {old_pending.pk, recent.pk}
    assert not left & {row.pk for row in old_done}
