"""Evolution's events have a size bound of their own (issue 45 §7; docs/security.md "Evolution's webhook"):
real events above the client API's 64 KiB body bound (a media message's caption and thumbnail, a
`messages.set` history batch) are processed on both channels; one over EVOLUTION_EVENT_MAX_BYTES is refused
the same way on both (nothing stored, counted); and an event the webhook keeps refusing ends in a visible
dead state that retention prunes, instead of being forwarded again forever."""

from __future__ import annotations

import base64
import copy
import json
import os
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from ingestion import inbox, reconciler, retention
from ingestion.models import IngestionEvent
from tests.ingestion.helpers import counter, post, sample, token_header
from tests.ingestion.test_consumer import (  # noqa: F401 (fixtures)
    connection,
    depth,
    exchange_name,
    publish_like_evolution,
    run_once,
    topo,
    web,
)

CAPTION = "Promoção de fim de ano! " * 40  # WhatsApp allows 1,024 characters in a caption


def media_upsert(instance: str = "alice-main", thumbnail_bytes: int = 120_000) -> dict:
    """An inbound image as Evolution sends it (messages.upsert; the message's imageMessage carries a
    caption and the jpegThumbnail WhatsApp attaches, base64): larger than 64 KiB."""
    payload = sample("webhook.messages.upsert.inbound-text.json", instance)
    thumbnail = base64.b64encode(os.urandom(thumbnail_bytes)).decode()
    payload["data"]["message"] = {"imageMessage": {
        "url": "https://mmg.whatsapp.net/v/t62.7118-24/abc.enc", "mimetype": "image/jpeg", "caption": CAPTION,
        "fileLength": "204800", "height": 1280, "width": 960, "jpegThumbnail": thumbnail,
    }}
    payload["data"]["messageType"] = "imageMessage"
    return payload


def history_batch(instance: str = "alice-main", messages: int = 600) -> dict:
    """A messages.set batch (history sync, with Evolution's `extra`: isLatest, progress)."""
    upsert = sample("webhook.messages.upsert.inbound-text.json", instance)
    rows = []
    for n in range(messages):
        row = copy.deepcopy(upsert["data"])
        row["key"]["id"] = f"3EB0{n:018X}"
        rows.append(row)
    return {"event": "messages.set", "instance": instance, "data": {"messages": rows}, "isLatest": False,
            "progress": 40, "date_time": upsert["date_time"], "sender": upsert.get("sender"),
            "server_url": upsert.get("server_url"), "apikey": None}


def size(payload: dict) -> int:
    return len(json.dumps(payload).encode())


@pytest.mark.parametrize("build", [media_upsert, history_batch], ids=["media-caption", "messages.set"])
def test_real_events_above_the_api_body_bound_are_taken_on_the_webhook(db, alice_instance, build):
    payload = build()
    assert django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE < size(payload) < django_settings.EVOLUTION_EVENT_MAX_BYTES

    response = post(payload, **token_header(alice_instance))

    assert response.status_code == 200, response.content[:300]
    assert IngestionEvent.objects.filter(event=payload["event"]).count() == 1


def test_an_event_over_the_bound_is_refused_on_the_webhook_and_stores_nothing(db, settings, alice_instance):
    settings.EVOLUTION_EVENT_MAX_BYTES = 100_000
    response = post(media_upsert(), **token_header(alice_instance))

    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "event_too_large" and error["details"] == {"limitBytes": 100_000}
    assert not IngestionEvent.objects.exists()
    assert counter("webhook:too_large") == 1


def test_a_large_event_is_taken_on_rabbitmq(transactional_db, web, connection, topo, exchange_name, alice_instance):
    payload = media_upsert()
    payload.pop("destination", None)
    publish_like_evolution(connection, exchange_name, payload, routing_key="messages.upsert")

    run_once(connection, topo)

    event = IngestionEvent.objects.get()
    assert event.processed_at is not None, event.last_error
    assert counter("rabbitmq:forward_ok") == 1 and depth(connection, topo.parking) == 0


def test_an_event_over_the_bound_is_refused_on_rabbitmq_the_same_way(transactional_db, web, settings, connection, topo,
                                                                     exchange_name, alice_instance):
    settings.EVOLUTION_EVENT_MAX_BYTES = 100_000
    payload = media_upsert()
    payload.pop("destination", None)
    publish_like_evolution(connection, exchange_name, payload, routing_key="messages.upsert")

    run_once(connection, topo)

    assert not IngestionEvent.objects.exists()  # never stored, so never forwarded again
    assert counter("rabbitmq:too_large") == 1
    assert depth(connection, topo.parking) == 1 and depth(connection, topo.work) == 0  # kept where an operator looks


def failing_for_an_hour(payload: dict, attempts: int) -> IngestionEvent:
    event, _ = inbox.record("RABBITMQ", payload)
    IngestionEvent.objects.filter(pk=event.pk).update(
        received_at=timezone.now() - timedelta(hours=1), forward_attempts=attempts, last_error="HTTP 413: too large"
    )
    return event


def test_an_event_the_webhook_keeps_refusing_ends_dead_and_is_pruned(db, settings, alice_instance):
    settings.INTERNAL_WEBHOOK_URL = "http://127.0.0.1:9/api/internal/webhook"  # every forward fails
    settings.INGESTION_MAX_FORWARDS = 3
    from tests.ingestion.helpers import receipt

    given_up = failing_for_an_hour(receipt("READ", key_id="3EB0DEAD00000000000001"), attempts=3)
    still_owed = failing_for_an_hour(receipt("READ", key_id="3EB0DEAD00000000000002"), attempts=2)

    reconciler.run_batch()

    given_up.refresh_from_db()
    assert given_up.processed_at is not None and given_up.outcome == reconciler.DEAD
    assert given_up.forward_attempts == 3 and "413" in given_up.last_error  # why, kept for the operator
    assert counter("reconciler:dead") == 1
    still_owed.refresh_from_db()
    assert still_owed.processed_at is None and still_owed.forward_attempts == 3

    # the next passes never forward it again
    reconciler.run_batch()
    given_up.refresh_from_db()
    assert given_up.forward_attempts == 3

    # and retention prunes it like any finished event
    IngestionEvent.objects.filter(pk=given_up.pk).update(received_at=timezone.now() - timedelta(days=400))
    retention.prune_inbox()
    assert not IngestionEvent.objects.filter(pk=given_up.pk).exists()
