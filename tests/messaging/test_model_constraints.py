"""The database itself refuses what must never exist: a second inbox row for one event, a second
live opt-in, a second idempotent answer, a status moving backwards (migration 0010's trigger,
tried with raw UPDATEs)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ingestion.models import IngestionEvent
from messaging import lifecycle
from messaging.models import IdempotencyRecord, Message, OptIn, Status


def test_the_inbox_dedup_key_is_unique(db):
    IngestionEvent.objects.create(dedup_key="a" * 64, channel="WEBHOOK", event="messages.update", payload={})
    with pytest.raises(IntegrityError), transaction.atomic():
        IngestionEvent.objects.create(dedup_key="a" * 64, channel="RABBITMQ", event="messages.update", payload={})


def test_one_live_opt_in_per_phone(alice):
    OptIn.objects.create(project=alice.project, phone="+5511988887777", source="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        OptIn.objects.create(project=alice.project, phone="+5511988887777", source="b")
    OptIn.objects.filter(project=alice.project).update(revoked_at=timezone.now())
    OptIn.objects.create(project=alice.project, phone="+5511988887777", source="c")  # history kept


def test_one_answer_per_idempotency_key(alice):
    IdempotencyRecord.objects.create(project=alice.project, key="k", request_hash="h", status_code=202, response={})
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyRecord.objects.create(project=alice.project, key="k", request_hash="x", status_code=202, response={})


def _message(alice, instance, status: str) -> Message:
    return Message.objects.create(
        project=alice.project, environment="LIVE", category="UTILITY", to="+5511988887777", template="hi",
        text="hi", instance=instance, deliver_until=timezone.now() + timedelta(hours=1), status=status,
    )


# The state machine of docs/architecture.md: delivery progress only moves right; back to QUEUED only
# from SENDING (a retry, a wait, a recovered lease) or FAILED (a force resend); into FAILED from
# QUEUED, SENDING (a failed send) or SENT, SERVER_ACK (an ERROR receipt).
_ORDER = [Status.QUEUED, Status.SENDING, Status.SENT, Status.SERVER_ACK, Status.DELIVERED, Status.READ]
_ALLOWED = {
    (old, new) for old in _ORDER for new in _ORDER if _ORDER.index(new) > _ORDER.index(old)
} | {
    (Status.SENDING, Status.QUEUED),
    (Status.FAILED, Status.QUEUED),
    *((old, Status.FAILED) for old in (Status.QUEUED, Status.SENDING, Status.SENT, Status.SERVER_ACK)),
}
_MOVES = [(old, new) for old in Status for new in Status if old != new]


@pytest.mark.parametrize(("old", "new"), _MOVES, ids=[f"{old}->{new}" for old, new in _MOVES])
def test_a_raw_update_cannot_move_a_status_backwards(alice, alice_instance, old, new):
    """Not the ORM's compare-and-set: a plain UPDATE, as a script or a forgotten guard would write it."""
    message = _message(alice, alice_instance, old)

    def move() -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE messaging_message SET status = %s WHERE id = %s", [new.value, message.pk])

    if (old, new) in _ALLOWED:
        move()
        assert Message.objects.get(pk=message.pk).status == new
    else:
        with pytest.raises(IntegrityError, match="may not move"), transaction.atomic():
            move()
        assert Message.objects.get(pk=message.pk).status == old


def test_a_raw_update_that_keeps_the_status_passes(alice, alice_instance):
    # Other columns of a finished message still change (a status check stamped, a retention sweep).
    message = _message(alice, alice_instance, Status.READ)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE messaging_message SET status = 'READ', status_checked_at = now() WHERE id = %s",
                       [message.pk])
    assert Message.objects.get(pk=message.pk).status_checked_at is not None


def test_a_late_receipt_changes_nothing(alice, alice_instance):
    """lifecycle.advance (a receipt's compare-and-set) ignores a receipt behind the status: no error, no line."""
    message = _message(alice, alice_instance, Status.SENT)
    assert lifecycle.advance(message, Status.READ)
    assert not lifecycle.advance(message, Status.DELIVERED)
    assert not lifecycle.advance(message, Status.SERVER_ACK)
    assert not lifecycle.advance(message, Status.READ)
    message.refresh_from_db()
    assert message.status == Status.READ
    assert message.events.filter(kind="STATUS").count() == 1
