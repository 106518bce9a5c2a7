"""A number that sends nothing holds its due backlog in one go (messaging.sending.backlog_hold): each entry due before
the recheck, never past its message's deliverUntil, in batches, leaving entries another transaction holds."""

from __future__ import annotations

import threading
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from messaging.models import Message, MessageEvent, OutboxEntry
from messaging.sending import backlog_hold
from tests.conftest import add_instance
from tests.ingestion.test_row_locks import held_in_another_transaction
from tests.messaging.sending_helpers import queue

RESTING = {"why": "resting", "instance": "alice-main"}


def waiting_lines(message_ids) -> int:
    return MessageEvent.objects.filter(message_id__in=message_ids, kind="WAITING").count()


def test_it_holds_the_numbers_due_entries_in_batches_and_nothing_else(alice, alice_instance, carol, monkeypatch):
    backlog = queue(alice, "UTILITY", 7)
    later = backlog.pop()
    OutboxEntry.objects.filter(message_id=later).update(available_at=timezone.now() + timedelta(hours=1))
    add_instance(carol.project, "carol-main")
    elsewhere = queue(carol, "UTILITY", 2)
    monkeypatch.setattr(backlog_hold, "HOLD_BATCH", 4)
    now = timezone.now()
    until = now + timedelta(seconds=60)

    assert backlog_hold.hold_due_backlog(alice_instance.pk, until, RESTING, now) == 4
    assert backlog_hold.hold_due_backlog(alice_instance.pk, until, RESTING, now) == 2  # the rest of it
    assert backlog_hold.hold_due_backlog(alice_instance.pk, until, RESTING, now) == 0

    assert set(OutboxEntry.objects.filter(message_id__in=backlog).values_list("available_at", flat=True)) == {until}
    assert set(Message.objects.filter(pk__in=backlog).values_list("hold_reason", flat=True)) == {"resting|alice-main|"}
    assert waiting_lines(backlog) == 6  # one each: held twice for the same reason is one line
    assert Message.objects.get(pk=later).hold_reason is None and waiting_lines([later]) == 0
    others = OutboxEntry.objects.filter(message_id__in=elsewhere).values_list("available_at", flat=True)
    assert all(at <= now for at in others)


def test_an_entry_is_never_held_past_its_deadline(alice, alice_instance):
    [message_id] = queue(alice, "UTILITY", 1)
    deadline = timezone.now() + timedelta(seconds=20)
    Message.objects.filter(pk=message_id).update(deliver_until=deadline)
    now = timezone.now()

    assert backlog_hold.hold_due_backlog(alice_instance.pk, now + timedelta(seconds=60), RESTING, now) == 1
    assert OutboxEntry.objects.get(message_id=message_id).available_at == deadline


def test_an_entry_another_transaction_holds_is_left_to_it(transactional_db, alice, alice_instance):
    taken, free = queue(alice, "UTILITY", 2)
    taken_entry = OutboxEntry.objects.get(message_id=taken).pk

    def relay_releasing(locked: threading.Event, release: threading.Event) -> None:
        with transaction.atomic():
            list(OutboxEntry.objects.select_for_update(skip_locked=True).filter(pk=taken_entry))
            locked.set()
            release.wait(10)

    now = timezone.now()
    with held_in_another_transaction(relay_releasing):
        with connection.cursor() as cursor:  # never waits for it
            cursor.execute("SET lock_timeout = '300ms'")
        try:
            assert backlog_hold.hold_due_backlog(alice_instance.pk, now + timedelta(seconds=60), RESTING, now) == 1
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    assert Message.objects.get(pk=taken).hold_reason is None
    assert Message.objects.get(pk=free).hold_reason == "resting|alice-main|"
