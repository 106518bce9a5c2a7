"""GET /api/internal/metrics (JSON) and /api/internal/metrics/prometheus: every counter, secret-protected."""

from __future__ import annotations

import contextlib

import pytest
from django.test import Client
from django_redis import get_redis_connection

from messaging.models import Status
from pilot_status import metrics
from tests.ingestion.helpers import counter, make_message, post, receipt, token_header

JSON_URL = "/api/internal/metrics"
PROM_URL = "/api/internal/metrics/prometheus"


@pytest.fixture
def secret(settings):
    return {"HTTP_X_INTERNAL_WEBHOOK_SECRET": settings.INTERNAL_WEBHOOK_SECRET}


def test_it_lists_every_counter_as_json(transactional_db, alice, alice_instance, secret):
    message = make_message(alice.project, alice_instance)
    post(receipt("READ"), **token_header(alice_instance))
    post(receipt("READ", instance="alice-main"), HTTP_X_WEBHOOK_TOKEN="wrong")
    message.refresh_from_db()
    assert message.status == Status.READ

    body = Client().get(JSON_URL, **secret).json()

    counters = body["counters"]
    assert counters["ps:metrics:evolution:webhook:processed"] == 1
    assert counters["ps:metrics:evolution:webhook:unauthorized"] == 1
    # message counters per status and lane come from the timeline, counted on commit
    assert counters["ps:metrics:messages:status:READ:utility"] == 1
    # every counter: all that Redis holds under the prefix, read here without metrics.read_all
    redis = get_redis_connection("default")
    stored = {key.decode(): int(redis.get(key)) for key in redis.keys(metrics.PREFIX + "*")}
    assert counters == stored


def test_it_renders_prometheus_text(db, secret):
    metrics.evolution("webhook:processed", 3)
    metrics.messages("status:DELIVERED:otp", 2)
    metrics.messages("failed:EXPIRED:marketing")

    response = Client().get(PROM_URL, **secret)

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    assert "# TYPE pilot_status_evolution_webhook_processed_total counter" in text
    assert "pilot_status_evolution_webhook_processed_total 3" in text
    assert 'pilot_status_messages_status_total{lane="otp",status="DELIVERED"} 2' in text
    assert 'pilot_status_messages_failed_total{lane="marketing",reason="EXPIRED"} 1' in text


@pytest.mark.parametrize("url", [JSON_URL, PROM_URL])
@pytest.mark.parametrize("headers", [{}, {"HTTP_X_INTERNAL_WEBHOOK_SECRET": "guess"}])
def test_it_needs_the_internal_secret(db, url, headers):
    response = Client().get(url, **headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


def test_post_is_405(db, secret):
    assert Client().post(JSON_URL, **secret).status_code == 405


def test_counts_made_while_an_event_is_locked_go_out_with_the_release(db):
    from ingestion.locks import event_lock

    name = "status:READ:utility"
    with event_lock("a-dedup-key", "webhook:skipped") as hold:
        assert hold
        metrics.messages(name)
        hold.count("webhook:processed")
        # held back: one pipeline with the lock's release sends them all
        assert metrics.redis().get(metrics.MESSAGES + name) is None
    assert int(metrics.redis().get(metrics.MESSAGES + name)) == 1
    assert int(metrics.redis().get(metrics.EVOLUTION + "webhook:processed")) == 1
    metrics.messages(name)  # outside a lock: at once
    assert int(metrics.redis().get(metrics.MESSAGES + name)) == 2


def test_a_batch_inside_another_keeps_the_outer_ones_counts():
    with metrics.batched() as outer:
        metrics.messages("a")
        with metrics.batched() as inner:
            metrics.messages("b")
        metrics.messages("c")
    assert outer == [(metrics.MESSAGES + "a", 1), (metrics.MESSAGES + "c", 1)]
    assert inner == [(metrics.MESSAGES + "b", 1)]


@contextlib.contextmanager
def redis_round_trips():
    client = metrics.redis()
    calls = []
    real_execute, real_pipe = client.execute_command, client.pipeline

    def counting_execute(*args, **kwargs):
        calls.append(args[0])
        return real_execute(*args, **kwargs)

    def counting_pipeline(*args, **kwargs):
        calls.append("PIPELINE")
        return real_pipe(*args, **kwargs)

    client.execute_command, client.pipeline = counting_execute, counting_pipeline
    try:
        yield calls
    finally:
        client.execute_command, client.pipeline = real_execute, real_pipe


def test_a_new_receipt_costs_two_redis_round_trips_and_a_copy_one(transactional_db, alice, alice_instance):
    # the lock (its script) and its release with every counter of the event (one pipeline)
    message = make_message(alice.project, alice_instance)
    assert post(receipt("SERVER_ACK"), **token_header(alice_instance)).status_code == 200  # auth cached
    with redis_round_trips() as calls:
        assert post(receipt("READ"), **token_header(alice_instance)).json()["reason"] == "applied"
    assert calls == ["EVALSHA", "PIPELINE"], calls
    message.refresh_from_db()
    assert message.status == Status.READ
    assert int(metrics.redis().get(metrics.MESSAGES + "status:READ:utility")) == 1

    # the copy finds the done mark; the same script counts it skipped
    with redis_round_trips() as calls:
        assert post(receipt("READ"), **token_header(alice_instance)).json()["reason"] == "already_processed"
    assert calls == ["EVALSHA"], calls
    assert counter("webhook:skipped") == 1
