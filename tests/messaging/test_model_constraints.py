"""The database itself refuses what must never exist: a second inbox row for one event, a second
live opt-in, a second idempotent answer, a status moving backwards."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from ingestion.models import IngestionEvent
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


def test_status_only_moves_forward(alice, alice_instance):
    message = Message.objects.create(
        project=alice.project, environment="LIVE", category="UTILITY", to="+5511988887777", template="hi",
        text="hi", instance=alice_instance, deliver_until=timezone.now() + timedelta(hours=1), status=Status.SENT,
    )
    assert message.advance(Status.READ)
    assert not message.advance(Status.DELIVERED)
    assert not message.advance(Status.SERVER_ACK)
    assert not message.advance(Status.READ)
    message.refresh_from_db()
    assert message.status == Status.READ
    assert message.events.filter(kind="STATUS").count() == 1
