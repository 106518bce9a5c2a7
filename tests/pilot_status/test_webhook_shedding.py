"""The webhook pool sheds an Evolution webhook that waited too long for a thread (pilot_status.queue_wait).

A shed webhook is answered 503 with Retry-After before any work: nothing is stored, nothing moves,
and Evolution's retry (or the event's RabbitMQ copy) brings the event in later. The consumer's
forwards and the counters are never shed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest
import requests
from django.conf import settings

from ingestion.models import IngestionEvent
from messaging.models import Status
from pilot_status import queue_wait
from pilot_status.internal_wsgi import application as internal_app
from tests.ingestion.helpers import KEY_ID, counter, make_message, receipt, token_header
from tests.pilot_status.test_internal_app import call, secret
from tests.support import processes

OTHER_KEY_ID = "3EB0C431C26A1916E07A4C"


@pytest.mark.parametrize(
    "waited, limit, shed",
    [(0.0, 10.0, False), (10.0, 10.0, False), (10.01, 10.0, True), (60.0, 10.0, True), (60.0, 0.0, False)],
)
def test_should_shed(waited, limit, shed):
    assert queue_wait.should_shed(waited, limit) is shed


def test_waited_is_zero_without_a_stamp_and_counts_from_it():
    queue_wait.stamp(None)
    assert queue_wait.waited() == 0.0
    queue_wait.stamp(100.0)
    try:
        assert queue_wait.waited(now=103.5) == 3.5
        assert queue_wait.waited(now=99.0) == 0.0  # a clock that went back counts as no wait
    finally:
        queue_wait.stamp(None)


@pytest.fixture
def waited_long():
    """This thread serves a request that waited past the limit (as the worker would stamp it)."""
    queue_wait.stamp(time.monotonic() - settings.WEBHOOK_SHED_AFTER_SECONDS - 1)
    yield
    queue_wait.stamp(None)


def test_a_webhook_that_waited_too_long_is_shed_unread(transactional_db, alice, alice_instance, waited_long):
    message = make_message(alice.project, alice_instance)

    answer = call(internal_app, "POST", "/api/internal/webhook", json.dumps(receipt("DELIVERY_ACK")).encode(),
                  **token_header(alice_instance))

    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "overloaded"
    assert answer.headers["retry-after"] == "5"
    assert int(answer.headers["content-length"]) == len(answer.body)
    message.refresh_from_db()
    assert message.status == Status.SENT  # nothing moved
    assert not IngestionEvent.objects.exists()  # nothing stored
    assert counter("webhook:shed") == 1
    assert counter("webhook:processed") == 0


def test_the_by_events_form_is_shed_too(transactional_db, alice, alice_instance, waited_long):
    answer = call(internal_app, "POST", "/api/internal/webhook/messages-update",
                  json.dumps(receipt("DELIVERY_ACK")).encode(), **token_header(alice_instance))
    assert answer.status_code == 503


def test_a_webhook_that_did_not_wait_long_is_applied(transactional_db, alice, alice_instance):
    message = make_message(alice.project, alice_instance)
    queue_wait.stamp(time.monotonic() - 1)
    try:
        answer = call(internal_app, "POST", "/api/internal/webhook", json.dumps(receipt("DELIVERY_ACK")).encode(),
                      **token_header(alice_instance))
    finally:
        queue_wait.stamp(None)
    assert answer.status_code == 200
    message.refresh_from_db()
    assert message.status == Status.DELIVERED


def test_shedding_off_applies_it(transactional_db, alice, alice_instance, waited_long, settings):
    settings.WEBHOOK_SHED_AFTER_SECONDS = 0
    message = make_message(alice.project, alice_instance)
    answer = call(internal_app, "POST", "/api/internal/webhook", json.dumps(receipt("DELIVERY_ACK")).encode(),
                  **token_header(alice_instance))
    assert answer.status_code == 200
    message.refresh_from_db()
    assert message.status == Status.DELIVERED


def test_the_consumers_forwards_and_the_counters_are_never_shed(transactional_db, alice, alice_instance, waited_long):
    # A forward carries the internal secret: whatever it then says, shedding does not answer it.
    forward = call(internal_app, "POST", "/api/internal/webhook", json.dumps({**receipt("READ"), "already_saved": True}).encode(),
                   **secret())
    assert forward.status_code != 503
    assert call(internal_app, "GET", "/api/internal/metrics", **secret()).status_code == 200
    assert counter("webhook:shed") == 0


def test_the_pool_under_gunicorn_sheds_what_queued_behind_a_stuck_thread(transactional_db, alice, alice_instance):
    """The Procfile's worker class, one thread: while a webhook is stuck on a row lock, the next one
    queues; once the thread frees, the one that waited past the limit is answered 503 at once, and
    its retry is applied."""
    stuck = make_message(alice.project, alice_instance)
    queued = make_message(alice.project, alice_instance, key_id=OTHER_KEY_ID)
    port = processes.free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "pilot_status.internal_wsgi:application", "-b", f"127.0.0.1:{port}",
         "-w", "1", "--worker-class", "pilot_status.webhook_worker.QueueTimedThreadWorker", "--threads", "1"],
        env={**os.environ, "DATABASE_URL": processes.test_database_url(), "WEBHOOK_SHED_AFTER_SECONDS": "0.5",
             "METRICS_FLUSH_SECONDS": "0"},
    )
    url = f"http://127.0.0.1:{port}/api/internal/webhook"
    answers: dict[str, Any] = {}

    def post(name: str, key_id: str) -> None:
        answers[name] = requests.post(url, json=receipt("DELIVERY_ACK", key_id=key_id),
                                      headers={"X-Webhook-Token": alice_instance.webhook_token}, timeout=30)

    try:
        processes.wait_for_port(port, proc=server)
        with psycopg.connect(processes.test_database_url()) as holder:
            holder.execute("SELECT 1 FROM messaging_message WHERE id = %s FOR UPDATE", [stuck.pk])
            first = threading.Thread(target=post, args=("stuck", KEY_ID))
            first.start()
            time.sleep(0.3)  # the pool's only thread is now waiting on the row lock
            second = threading.Thread(target=post, args=("queued", OTHER_KEY_ID))
            second.start()
            time.sleep(1.2)  # the second has waited past the 0.5-s limit for that thread
            holder.rollback()
        first.join(30)
        second.join(30)

        assert answers["stuck"].status_code == 200, answers["stuck"].text
        assert answers["queued"].status_code == 503, answers["queued"].text
        assert answers["queued"].json()["error"]["code"] == "overloaded"
        assert answers["queued"].headers["Retry-After"] == "5"
        queued.refresh_from_db()
        assert queued.status == Status.SENT
        assert IngestionEvent.objects.count() == 1  # the stuck one's only

        post("retry", OTHER_KEY_ID)  # Evolution's retry, on an idle pool
        assert answers["retry"].status_code == 200, answers["retry"].text
        queued.refresh_from_db()
        assert queued.status == Status.DELIVERED
        assert counter("webhook:shed") == 1
    finally:
        server.terminate()
        server.wait(10)
