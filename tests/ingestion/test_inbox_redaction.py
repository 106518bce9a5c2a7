"""Credentials never rest in the inbox (issue 21): Evolution's `apikey` (the instance token) and any other
credential field of the envelope are stripped before a payload is stored, on both channels, without
changing the dedup key; existing rows are stripped by a migration; admin shows none."""

from __future__ import annotations

import copy
import importlib
import json

import pytest
from django.apps import apps as django_apps
from django.contrib.auth.models import User
from django.db import connection as db_connection
from django.test import Client

from ingestion import inbox
from ingestion.models import IngestionEvent
from messaging.models import Status
from tests.ingestion.helpers import make_message, rabbit_copy, receipt, sample, token_header
from tests.ingestion.helpers import post as webhook_post
from tests.ingestion.test_consumer import connection, exchange_name, publish_like_evolution, run_once, topo, web  # noqa: F401

TOKEN = "TOKEN-ALICE-MAIN"


def with_credentials(payload):
    payload = copy.deepcopy(payload)
    payload.update(apikey=TOKEN, jwt_key="jwt-secret", token="tok-123", hash="hash-456")
    return payload


def raw_text_of(pk) -> str:
    with db_connection.cursor() as cursor:
        cursor.execute("SELECT payload::text FROM evolution_ingestion_events WHERE id = %s", [pk])
        return str(cursor.fetchone()[0])


def test_the_webhook_stores_no_credential(alice, alice_instance):
    make_message(alice.project, alice_instance)
    payload = with_credentials(receipt("DELIVERY_ACK"))

    assert webhook_post(payload).status_code == 200  # authenticated by the body apikey itself

    event = IngestionEvent.objects.get()
    assert not inbox.CREDENTIAL_FIELDS & set(event.payload)
    for secret in (TOKEN, "jwt-secret", "tok-123", "hash-456"):
        assert secret not in raw_text_of(event.pk)
    assert event.payload["data"]["status"] == "DELIVERY_ACK"  # the rest is kept as Evolution sent it


def test_the_webhooks_general_path_stores_no_credential_either(alice_instance):
    payload = with_credentials(sample("webhook.connection.update.open.json"))
    assert webhook_post(payload, **token_header(alice_instance)).status_code == 200
    assert TOKEN not in raw_text_of(IngestionEvent.objects.get().pk)


def test_the_rabbitmq_channel_stores_no_credential(alice_instance):
    payload = with_credentials(receipt("READ", channel="rabbitmq"))
    event, created = inbox.record("RABBITMQ", payload)
    assert created
    assert TOKEN not in raw_text_of(event.pk)
    assert "apikey" not in event.payload  # the returned row is what rests, too


def test_the_consumer_stores_no_credential(transactional_db, web, connection, topo, alice, alice_instance,
                                           exchange_name):
    message = make_message(alice.project, alice_instance)
    publish_like_evolution(connection, exchange_name, with_credentials(receipt("READ", channel="rabbitmq")))

    run_once(connection, topo)

    event = IngestionEvent.objects.get()
    assert event.channel == "RABBITMQ" and event.processed_at is not None
    assert TOKEN not in raw_text_of(event.pk)
    message.refresh_from_db()
    assert message.status == Status.READ


def test_stripping_keeps_the_dedup_key_identical_on_both_channels(alice, alice_instance, settings):
    message = make_message(alice.project, alice_instance)
    webhook_copy = with_credentials(receipt("DELIVERY_ACK"))
    rabbit = rabbit_copy(webhook_copy)
    rabbit["apikey"] = "some-other-token"

    assert inbox.dedup_key(webhook_copy) == inbox.dedup_key(rabbit) == inbox.dedup_key(inbox.at_rest(webhook_copy))
    event, _ = inbox.record("RABBITMQ", rabbit)
    assert webhook_post(webhook_copy).json() == {"status": "processed", "reason": "applied"}
    assert IngestionEvent.objects.count() == 1
    # The reconciler forwards what rests (no apikey): it must find the same row.
    forwarded = dict(IngestionEvent.objects.get().payload, already_saved=True)
    assert inbox.dedup_key(forwarded) == event.dedup_key
    message.refresh_from_db()
    assert message.status == Status.DELIVERED


def test_the_reconciler_forward_of_a_stripped_row_applies_it(alice, alice_instance, settings):
    message = make_message(alice.project, alice_instance)
    inbox.record("RABBITMQ", with_credentials(receipt("READ", channel="rabbitmq")))
    stored = IngestionEvent.objects.get().payload
    response = Client().post("/api/internal/webhook", data=json.dumps(dict(stored, already_saved=True)),
                             content_type="application/json",
                             HTTP_X_INTERNAL_WEBHOOK_SECRET=settings.INTERNAL_WEBHOOK_SECRET)
    assert response.json() == {"status": "processed", "reason": "applied"}
    assert IngestionEvent.objects.count() == 1
    message.refresh_from_db()
    assert message.status == Status.READ


def test_the_migration_strips_existing_rows_in_batches(alice_instance, monkeypatch):
    # Rows as the code before this change stored them: the apikey in the raw payload.
    keys = []
    for n in range(7):
        payload = with_credentials(receipt("READ", key_id=f"OLD{n}"))
        key = inbox.dedup_key(payload)
        keys.append(key)
        IngestionEvent.objects.create(dedup_key=key, channel="WEBHOOK", event="messages.update",
                                      instance_name="alice-main", key_id=f"OLD{n}", payload=payload)
    untouched = IngestionEvent.objects.create(dedup_key="x" * 64, channel="WEBHOOK", event="messages.update",
                                              instance_name="alice-main", payload={"event": "messages.update",
                                                                                   "data": {"apikey": "in-data"}})

    migration = importlib.import_module("ingestion.migrations.0006_strip_credentials_at_rest")
    monkeypatch.setattr(migration, "BATCH", 3)
    migration.strip_credentials(django_apps, None)

    for row in IngestionEvent.objects.exclude(pk=untouched.pk):
        assert not inbox.CREDENTIAL_FIELDS & set(row.payload)
        assert row.dedup_key in keys  # the identity is untouched
    untouched.refresh_from_db()
    assert untouched.payload["data"] == {"apikey": "in-data"}  # data is content: the envelope's fields only


@pytest.fixture
def staff_client(db):
    user = User.objects.create_superuser("root", "root@example.test", "pw")
    client = Client()
    client.force_login(user)
    return client


def test_admin_shows_no_credential_even_for_a_row_not_yet_stripped(staff_client, alice_instance):
    event = IngestionEvent.objects.create(dedup_key="k" * 64, channel="WEBHOOK", event="messages.update",
                                          instance_name="alice-main", payload=with_credentials(receipt("READ")))

    page = staff_client.get(f"/admin/ingestion/ingestionevent/{event.pk}/change/")

    assert page.status_code == 200
    text = page.content.decode()
    assert "3EB0C431C26A1916E07A4B" in text  # the payload is shown
    for secret in (TOKEN, "jwt-secret", "tok-123", "hash-456"):
        assert secret not in text
