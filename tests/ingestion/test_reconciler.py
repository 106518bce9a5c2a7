"""The ingestion reconciler: unprocessed events older than the threshold are forwarded again."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from ingestion import inbox, reconciler
from ingestion.models import IngestionEvent
from messaging.models import Status
from tests.ingestion.helpers import counter, make_message, receipt


def saved_but_never_forwarded(payload, age=timedelta(minutes=3)):
    event, _ = inbox.record("RABBITMQ", payload)  # the consumer died right after this
    IngestionEvent.objects.filter(pk=event.pk).update(received_at=timezone.now() - age)
    return event


def test_it_finishes_events_a_crash_left_unprocessed(transactional_db, live_server, settings, alice, alice_instance):
    settings.INTERNAL_WEBHOOK_URL = f"{live_server.url}/api/internal/webhook"
    message = make_message(alice.project, alice_instance)
    event = saved_but_never_forwarded(receipt("READ", channel="rabbitmq"))

    assert reconciler.run_batch() == 1

    event.refresh_from_db()
    assert event.processed_at is not None and event.forward_attempts == 1
    message.refresh_from_db()
    assert message.status == Status.READ
    assert counter("reconciler:reforwarded") == 1


def test_it_leaves_fresh_events_to_their_channel(transactional_db, live_server, settings, alice, alice_instance):
    settings.INTERNAL_WEBHOOK_URL = f"{live_server.url}/api/internal/webhook"
    settings.INGESTION_STALE_AFTER_SECONDS = 120
    make_message(alice.project, alice_instance)
    saved_but_never_forwarded(receipt("READ"), age=timedelta(seconds=30))

    assert reconciler.run_batch() == 0


def test_it_stops_early_when_the_web_is_down(db, settings, alice_instance):
    settings.INTERNAL_WEBHOOK_URL = "http://127.0.0.1:9/api/internal/webhook"
    for status in ("SERVER_ACK", "DELIVERY_ACK", "READ", "PLAYED", "ERROR"):
        saved_but_never_forwarded(receipt(status))

    assert reconciler.run_batch() == 0

    attempted = IngestionEvent.objects.filter(forward_attempts=1).count()
    assert attempted == reconciler.MAX_CONSECUTIVE_FAILURES
    assert IngestionEvent.objects.filter(processed_at__isnull=True).count() == 5


def test_events_that_always_fail_do_not_hold_the_line(transactional_db, live_server, settings, alice, alice_instance):
    """Issue 22: a pass stops after three failed forwards in a row; when those are always the same
    three oldest events (the webhook refuses them), newer ones must still get their turn."""
    settings.INTERNAL_WEBHOOK_URL = f"{live_server.url}/api/internal/webhook"
    old = timezone.now() - timedelta(hours=1)
    for n in range(reconciler.MAX_CONSECUTIVE_FAILURES):
        IngestionEvent.objects.create(
            dedup_key=f"{n:064d}", channel="RABBITMQ", event="messages.update", payload={"not": "an event"},
            received_at=old,
        )
    message = make_message(alice.project, alice_instance)
    event = saved_but_never_forwarded(receipt("READ", channel="rabbitmq"))

    for _ in range(3):
        reconciler.run_batch()
        event.refresh_from_db()
        if event.processed_at is not None:
            break
    assert event.processed_at is not None
    message.refresh_from_db()
    assert message.status == Status.READ
