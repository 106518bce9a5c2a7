"""The dedup key: one event is one key whatever the channel; two statuses are two events."""

from __future__ import annotations

import threading

from django.db import connection

from ingestion import inbox
from ingestion.models import IngestionEvent
from tests.ingestion.helpers import rabbit_copy, receipt, sample


def test_the_webhook_and_rabbitmq_copies_of_one_event_share_a_key():
    webhook = receipt("READ")
    assert inbox.dedup_key(webhook) == inbox.dedup_key(rabbit_copy(webhook))


def test_evolutions_retry_with_another_apikey_or_server_url_is_the_same_event():
    webhook = receipt("READ")
    assert inbox.dedup_key(webhook) == inbox.dedup_key(dict(webhook, apikey=None, server_url="http://other"))


def test_two_statuses_of_one_message_are_two_events():
    assert inbox.dedup_key(receipt("DELIVERY_ACK")) != inbox.dedup_key(receipt("READ"))


def test_the_same_status_on_another_instance_is_another_event():
    assert inbox.dedup_key(receipt("READ")) != inbox.dedup_key(receipt("READ", instance="bob-main"))


def test_the_key_ignores_the_order_of_fields():
    payload = receipt("READ")
    reordered = dict(payload, data=dict(reversed(list(payload["data"].items()))))
    assert inbox.dedup_key(payload) == inbox.dedup_key(reordered)


def test_a_connection_state_seen_again_later_is_a_new_event():
    first = sample("webhook.connection.update.open.json")
    again = dict(first, date_time="2025-10-21T12:00:00.000Z")
    assert inbox.dedup_key(first) != inbox.dedup_key(again)
    assert inbox.dedup_key(first) == inbox.dedup_key(dict(first, destination="http://elsewhere"))


def test_concurrent_records_of_one_event_store_one_row(transactional_db):
    payload = receipt("READ")
    results: list[bool] = []

    def save(channel: str, body: dict) -> None:
        try:
            results.append(inbox.record(channel, body)[1])
        finally:
            connection.close()

    threads = [threading.Thread(target=save, args=(c, b)) for c, b in
               [("WEBHOOK", payload), ("RABBITMQ", rabbit_copy(payload))] * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results) == [False] * 7 + [True]
    assert IngestionEvent.objects.count() == 1


def test_an_event_with_nul_or_lone_surrogates_is_stored_with_replacement_characters(db):
    # Postgres' jsonb refuses both; refusing the event would make Evolution retry it for ever.
    payload = sample("webhook.messages.upsert.inbound-text.json")
    payload["data"]["pushName"] = "Ana\x00Maria"
    payload["data"]["message"]["conversation"] = "oi \ud800 tudo bem"

    event, created = inbox.record("WEBHOOK", payload)

    assert created
    stored = IngestionEvent.objects.get(pk=event.pk).payload
    assert stored["data"]["pushName"] == "Ana\ufffdMaria"
    assert stored["data"]["message"]["conversation"] == "oi \ufffd tudo bem"
    # the key is the original's: the RabbitMQ copy of the same event meets this row
    again, created_again = inbox.record("RABBITMQ", rabbit_copy(payload))
    assert not created_again and again.pk == event.pk
