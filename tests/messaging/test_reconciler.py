"""The message reconciler's passes, called directly (run_batch) on real Postgres.
Each stuck state is made by letting its time pass on the row."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.utils import timezone

from messaging import reconciler
from messaging.models import Message, OutboxEntry
from tests.messaging.sending_helpers import assert_dead_lettered, events, send


def released(message: Message, ago: timedelta) -> None:
    """The relay released it `ago` (its outbox row is gone) and no worker ever claimed it."""
    OutboxEntry.objects.filter(message=message).delete()
    when = timezone.now() - ago
    Message.objects.filter(pk=message.pk).update(dispatched_at=when, next_attempt_at=when)


def test_it_recovers_an_expired_lease_and_confirms_before_resending(alice, alice_instance):
    message = send(alice)
    OutboxEntry.objects.filter(message=message).delete()
    Message.objects.filter(pk=message.pk).update(
        status="SENDING", lease_token=uuid.uuid4(), lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    report = reconciler.run_batch()
    assert report.leases_recovered == 1
    message.refresh_from_db()
    assert message.status == "QUEUED" and message.lease_token is None and message.attempts == 0
    assert message.unconfirmed_attempt_at is not None  # the dead worker may have sent it
    assert OutboxEntry.objects.filter(message=message).exists()
    assert events(message, "RECOVERED")


def test_it_leaves_a_live_lease_alone(alice, alice_instance):
    message = send(alice)
    Message.objects.filter(pk=message.pk).update(
        status="SENDING", lease_token=uuid.uuid4(), lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    assert reconciler.run_batch().leases_recovered == 0
    assert Message.objects.get(pk=message.pk).status == "SENDING"


def test_it_releases_again_an_otp_the_broker_lost_after_seconds(alice, official_instance):
    message = send(alice, "OTP")
    released(message, timedelta(seconds=20))
    assert reconciler.run_batch().redispatched == 1
    message.refresh_from_db()
    assert message.dispatched_at is None
    assert OutboxEntry.objects.filter(message=message, lane="otp").exists()


def test_marketing_gets_minutes_before_it_counts_as_lost(alice, alice_instance):
    message = send(alice, "MARKETING")
    released(message, timedelta(minutes=2))
    assert reconciler.run_batch().redispatched == 0
    released(message, timedelta(minutes=11))
    assert reconciler.run_batch().redispatched == 1


def test_it_expires_a_queued_message_past_deliver_until_into_the_dead_letters(alice, alice_instance):
    message = send(alice)
    Message.objects.filter(pk=message.pk).update(deliver_until=timezone.now() - timedelta(seconds=1))
    assert reconciler.run_batch().expired == 1
    letter = assert_dead_lettered(message, "EXPIRED")
    assert "deliverUntil" in letter.detail
    assert not OutboxEntry.objects.filter(message=message).exists()
    assert reconciler.run_batch().expired == 0  # once only
