"""The RabbitMQ channel, on the real broker: save, forward with already_saved, ack; retries."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import amqp
import pytest
from django.utils import timezone
from kombu import Connection

from ingestion import consumer as consumer_module
from ingestion.models import IngestionEvent
from messaging.models import Message, Status
from pilot_status import metrics

SAMPLES = Path(__file__).resolve().parents[1] / "messaging" / "samples"
KEY_ID = "3EB0C431C26A1916E07A4B"


@pytest.fixture
def exchange_name(settings):
    # A fresh exchange per test keeps queues of parallel runs apart.
    settings.EVOLUTION_RABBITMQ_EXCHANGE = f"evolution_test_{uuid.uuid4().hex[:8]}"
    return settings.EVOLUTION_RABBITMQ_EXCHANGE


@pytest.fixture
def connection(settings):
    with Connection(settings.EVOLUTION_RABBITMQ_URL) as conn:
        yield conn


@pytest.fixture
def topo(connection, exchange_name, monkeypatch):
    suffix = uuid.uuid4().hex[:8]
    monkeypatch.setattr(consumer_module, "WORK_QUEUE", f"ps.test.ingest.{suffix}")
    monkeypatch.setattr(consumer_module, "PARKING_QUEUE", f"ps.test.parked.{suffix}")
    monkeypatch.setattr(consumer_module, "retry_queue_name", lambda d: f"ps.test.retry.{d}s.{suffix}")
    topology = consumer_module.topology()
    channel = connection.default_channel
    for exchange in topology.exchanges:
        exchange.bind(channel).declare()
    topology.work.bind(channel).declare()
    for queue in [*topology.retries, topology.parking]:
        queue.bind(channel).declare()
    yield topology
    for queue in [topology.work, *topology.retries, topology.parking]:
        queue.bind(channel).delete()
    for exchange in topology.exchanges:
        exchange.bind(channel).delete()


def publish_like_evolution(connection, exchange, routing_key, payload):
    # Evolution publishes with no properties at all: no content_type, no delivery_mode.
    channel = connection.default_channel
    channel.basic_publish(amqp.Message(json.dumps(payload).encode()), exchange=exchange, routing_key=routing_key)


def rabbit_body(status="DELIVERY_ACK", instance="alice-main"):
    payload = json.loads((SAMPLES / "rabbitmq.messages.update.body.json").read_text())
    payload["instance"] = instance
    payload["data"]["status"] = status
    return payload


def run_once(connection, topology, count=1):
    worker = consumer_module.EvolutionConsumer(connection, topology)
    for _ in worker.consume(limit=count, timeout=10):
        pass
    return worker


def counter(name):
    return int(metrics.redis().get(metrics.EVOLUTION + name) or 0)


@pytest.fixture
def sent_message(alice, alice_instance):
    return Message.objects.create(
        project=alice.project, environment="LIVE", category="UTILITY", to="+5511999999999", template="hi",
        text="hi", instance=alice_instance, deliver_until=timezone.now() + timedelta(hours=1), status=Status.SENT,
        sent_at=timezone.now(), evolution_message_id=KEY_ID,
    )


def test_it_saves_forwards_and_acks(transactional_db, live_server, settings, connection, topo, sent_message, exchange_name):
    settings.INTERNAL_WEBHOOK_URL = f"{live_server.url}/api/internal/webhook"
    publish_like_evolution(connection, exchange_name, "messages.update", rabbit_body())

    run_once(connection, topo)

    event = IngestionEvent.objects.get()
    assert event.channel == "RABBITMQ"
    assert event.processed_at is not None
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED
    assert counter("rabbitmq:forward_ok") == 1


def test_an_event_already_processed_by_the_webhook_is_skipped(
    transactional_db, live_server, settings, connection, topo, sent_message, exchange_name
):
    from ingestion import receive

    settings.INTERNAL_WEBHOOK_URL = f"{live_server.url}/api/internal/webhook"
    body = rabbit_body()
    webhook_copy = dict(body, destination="http://x/webhook", date_time="2025-10-21T11:41:15.000Z")
    receive.receive_webhook(webhook_copy)
    publish_like_evolution(connection, exchange_name, "messages.update", body)

    run_once(connection, topo)

    assert IngestionEvent.objects.count() == 1
    assert IngestionEvent.objects.get().channel == "WEBHOOK"
    assert counter("rabbitmq:forward_ok") == 0
    assert sent_message.events.filter(kind="STATUS").count() == 1


def test_a_failed_forward_goes_to_the_retry_queue_not_a_hot_loop(
    transactional_db, settings, connection, topo, sent_message, exchange_name
):
    settings.INTERNAL_WEBHOOK_URL = "http://127.0.0.1:9/api/internal/webhook"  # nothing listens
    publish_like_evolution(connection, exchange_name, "messages.update", rabbit_body())

    run_once(connection, topo)

    assert counter("rabbitmq:forward_fail") == 1
    retry = topo.retries[0].bind(connection.default_channel)
    _, in_retry, _ = retry.queue_declare(passive=True)
    assert in_retry == 1
    event = IngestionEvent.objects.get()  # saved once, still waiting for its business logic
    assert event.processed_at is None


def test_garbage_is_parked(transactional_db, connection, topo, exchange_name):
    channel = connection.default_channel
    channel.basic_publish(amqp.Message(b"not json"), exchange=exchange_name, routing_key="messages.update")

    run_once(connection, topo)

    parked = topo.parking.bind(channel)
    _, count, _ = parked.queue_declare(passive=True)
    assert count == 1
    assert IngestionEvent.objects.count() == 0
