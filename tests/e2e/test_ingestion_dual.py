"""Dual ingestion on real parts: the simulator posts webhooks and publishes to RabbitMQ, the stack's
web and consumer ingest them. Each event has exactly one effect whichever channels carry it."""

from __future__ import annotations

import random
import signal
import socket
import sys
import uuid
from datetime import timedelta

import pytest
import requests

from ingestion import inbox, reconciler
from ingestion.locks import LOCK_PREFIX
from ingestion.models import IngestionEvent
from messaging import lifecycle
from messaging.models import Message, Status
from pilot_status import metrics
from tests.ingestion.helpers import counter, make_message, receipt
from tests.ingestion.outage import stopped
from tests.support.processes import Process, log_size, wait_for_log
from tests.support.simulator import wait_until

ORDER = ["SENT", "SERVER_ACK", "DELIVERED", "READ"]


def new_key_id() -> str:
    # Unique per test: a straggler from an earlier test (or run) never matches this test's rows.
    return "3EB0" + uuid.uuid4().hex[:18].upper()


def rows(key_id: str):
    return IngestionEvent.objects.filter(key_id=key_id)


def receipt_data(status: str, key_id: str) -> dict:
    return {"keyId": key_id, "remoteJid": "5511999999999@s.whatsapp.net", "fromMe": True, "status": status,
            "instanceId": "0b5e2f4c-7d1a-4c3e-9f62-8a1b2c3d4e5f"}


def live(simulator, stack, instance, **faults):
    simulator.register(instance, stack.webhook_url)
    if faults:
        simulator.faults(instance.name, **faults)


def statuses(message: Message) -> list[str]:
    return [e.detail["status"] for e in message.events.filter(kind="STATUS").order_by("created_at", "pk")]


def rabbitmq_settled(count: int = 1) -> bool:
    """The consumer has finished its copies (forwarded, or found them already processed)."""
    return counter("rabbitmq:forward_ok") + counter("rabbitmq:skipped") >= count


def test_one_event_through_both_channels_at_once_is_processed_exactly_once(stack, simulator, alice, alice_instance):
    # given: both channels deliver every event (webhook + the global RabbitMQ exchange)
    live(simulator, stack, alice_instance)
    key = new_key_id()
    message = make_message(alice.project, alice_instance, key_id=key)

    # when: Evolution emits three receipts, each through both channels at once
    for status in ("SERVER_ACK", "DELIVERY_ACK", "READ"):
        simulator.emit(alice_instance.name, "messages.update", receipt_data(status, key))

    # then: three events, one row each, each applied once
    wait_until(lambda: rows(key).filter(processed_at__isnull=False).count() == 3 and rabbitmq_settled(3)
               and simulator.stats()["webhook"]["ok"] >= 3, timeout=30, message="both channels settled")
    assert rows(key).count() == 3
    assert rows(key).filter(processed_at__isnull=True).count() == 0
    # one per event (an earlier test's straggler may add); a process sends its counts within a second
    wait_until(lambda: counter("webhook:processed") >= 3, timeout=5, message="webhook:processed counted")
    message.refresh_from_db()
    assert message.status == Status.READ
    timeline = statuses(message)
    assert timeline[-1] == "READ" and len(timeline) == len(set(timeline))


def test_a_dropped_webhook_is_delivered_by_rabbitmq(stack, simulator, alice, alice_instance):
    live(simulator, stack, alice_instance, webhook_drop_rate=1.0)
    key = new_key_id()
    message = make_message(alice.project, alice_instance, key_id=key)

    simulator.emit(alice_instance.name, "messages.update", receipt_data("DELIVERY_ACK", key))

    wait_until(lambda: rabbitmq_settled(1), timeout=20, message="the RabbitMQ copy forwarded")
    message.refresh_from_db()
    assert message.status == Status.DELIVERED
    event = rows(key).get()
    assert event.channel == "RABBITMQ" and event.processed_at is not None
    assert simulator.stats()["webhook"]["dropped"] == 1


def test_web_down_while_the_consumer_forwards_retries_through_the_delay_queue(stack, simulator, alice, alice_instance):
    # given: the web process is down and the webhook copy is lost
    live(simulator, stack, alice_instance, webhook_drop_rate=1.0)
    key = new_key_id()
    message = make_message(alice.project, alice_instance, key_id=key)
    stack.processes["web"].stop()
    try:
        # when: the event arrives through RabbitMQ only
        simulator.emit(alice_instance.name, "messages.update", receipt_data("READ", key))
        # then: it is saved, the forward fails and the message waits in the 5 s delay queue
        wait_until(lambda: rows(key).filter(forward_attempts__gte=1).exists(), timeout=20, message="a failed forward")
        assert rows(key).get().processed_at is None
        wait_until(lambda: counter("rabbitmq:forward_fail") >= 1, timeout=5, message="forward_fail counted")
    finally:
        stack.restart("web")

    # and once the web is back, the retry succeeds
    wait_until(lambda: rows(key).filter(processed_at__isnull=False).exists(), timeout=60, message="the retried forward")
    wait_until(lambda: counter("rabbitmq:forward_ok") >= 1, timeout=20)
    message.refresh_from_db()
    assert message.status == Status.READ
    assert rows(key).count() == 1


def test_a_consumer_killed_between_save_and_forward_is_finished_by_the_reconciler(
    stack, simulator, alice, alice_instance, settings
):
    # given: a consumer whose forward hangs (a web that accepts and never answers)
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(16)
    env = dict(stack.env, INTERNAL_WEBHOOK_URL=f"http://127.0.0.1:{blackhole.getsockname()[1]}/api/internal/webhook")
    stack.processes["consumer"].stop()
    doomed = Process("consumer-doomed", [sys.executable, "manage.py", "run_consumer"], env)
    offset = log_size(doomed.log)
    doomed.start()
    try:
        wait_for_log(doomed.log, "Connected to amqp", proc=doomed.proc, start_at=offset)
        live(simulator, stack, alice_instance, webhook_drop_rate=1.0)
        key = new_key_id()
        message = make_message(alice.project, alice_instance, key_id=key)

        # when: it saves the event, then dies before its forward returns
        simulator.emit(alice_instance.name, "messages.update", receipt_data("READ", key))
        event = wait_until(lambda: rows(key).first(), timeout=20)
        doomed.kill(signal.SIGKILL)
    finally:
        doomed.kill(signal.SIGKILL)
        blackhole.close()
        stack.restart("consumer")
    assert event.processed_at is None

    # then: the reconciler forwards it again (already_saved) and the web applies it
    settings.INTERNAL_WEBHOOK_URL = stack.webhook_url
    assert reconciler.run_batch(stale_after=timedelta(0)) >= 1
    event.refresh_from_db()
    assert event.processed_at is not None
    message.refresh_from_db()
    assert message.status == Status.READ
    assert counter("reconciler:reforwarded") >= 1

    # and the unacked copy RabbitMQ gave back waits out the dead holder's lock, then is skipped
    metrics.redis().delete(LOCK_PREFIX + event.dedup_key)  # the 2-minute TTL, fast-forwarded
    wait_until(lambda: counter("rabbitmq:skipped") >= 1, timeout=30, message="the redelivered copy skipped")
    # (it met the lock held first: kept for another look; whether it also went through the 5 s delay queue depends on
    # when the lock went, within its looks or after them)
    wait_until(lambda: counter("rabbitmq:lock_waited") >= 1, timeout=30, message="the wait for the lock counted")
    assert rows(key).count() == 1
    assert statuses(message) == ["READ"]


def test_statuses_shuffled_out_of_order_end_forward_only(stack, simulator, alice, alice_instance):
    live(simulator, stack, alice_instance)
    messages = [make_message(alice.project, alice_instance, key_id=new_key_id()) for _ in range(4)]
    emitted = [(m, s) for m in messages for s in ("SERVER_ACK", "DELIVERY_ACK", "READ")]
    random.Random(5).shuffle(emitted)

    for message, status in emitted:
        simulator.emit(alice_instance.name, "messages.update", receipt_data(status, message.evolution_message_id))

    wait_until(lambda: rabbitmq_settled(len(emitted)) and simulator.stats()["webhook"]["ok"] >= len(emitted),
               timeout=40, message="all receipts settled")
    assert IngestionEvent.objects.filter(key_id__in=[m.evolution_message_id for m in messages]).count() == len(emitted)
    for message in messages:
        message.refresh_from_db()
        assert message.status == Status.READ
        timeline = statuses(message)
        assert timeline == sorted(timeline, key=ORDER.index) and len(timeline) == len(set(timeline))


def test_an_ack_before_the_send_commit_is_applied_when_the_send_lands(stack, simulator, alice, alice_instance):
    # given: the worker called sendText, Evolution already acked, the worker has not committed
    live(simulator, stack, alice_instance)
    key = new_key_id()
    message = make_message(alice.project, alice_instance, status=Status.SENDING)
    simulator.emit(alice_instance.name, "messages.update", receipt_data("DELIVERY_ACK", key))
    wait_until(lambda: rabbitmq_settled(1) and simulator.stats()["webhook"]["ok"] >= 1, timeout=20)
    event = rows(key).get()
    assert event.processed_at is None and event.outcome == "waiting_for_message"

    # when: the send commits
    lifecycle.mark_sent(message, None, key, "5511999999999@s.whatsapp.net", {})

    # then: the early ack is applied at once
    message.refresh_from_db()
    assert message.status == Status.DELIVERED
    event.refresh_from_db()
    assert event.processed_at is not None


def test_a_forged_already_saved_is_refused_by_the_running_web(stack, alice, alice_instance):
    message = make_message(alice.project, alice_instance)
    forged = dict(receipt("READ"), already_saved=True)
    for headers in ({}, {"x-internal-webhook-secret": "guess"}, {"x-webhook-token": alice_instance.webhook_token}):
        response = requests.post(stack.webhook_url, json=forged, headers=headers, timeout=10)
        assert response.status_code == 401
    assert not IngestionEvent.objects.filter(dedup_key=inbox.dedup_key(forged)).exists()
    message.refresh_from_db()
    assert message.status == Status.SENT


@pytest.mark.serial
def test_rabbitmq_down_the_webhook_delivers_and_the_consumer_carries_on(stack, simulator, alice, alice_instance):
    live(simulator, stack, alice_instance)
    during, after = new_key_id(), new_key_id()
    first = make_message(alice.project, alice_instance, key_id=during)
    second = make_message(alice.project, alice_instance, key_id=after)
    consumer_log = stack.processes["consumer"].log
    offset = log_size(consumer_log)

    # when: RabbitMQ is really down, Evolution's RabbitMQ copy is lost; the webhook delivers
    with stopped("rabbitmq"):
        simulator.emit(alice_instance.name, "messages.update", receipt_data("READ", during))
        wait_until(lambda: Message.objects.filter(pk=first.pk, status=Status.READ).exists(), timeout=20)
    assert rows(during).get().channel == "WEBHOOK"

    # then: the consumer reconnects by itself and RabbitMQ alone delivers again
    wait_for_log(consumer_log, "Connected to amqp", timeout=90, start_at=offset)
    wait_until(lambda: simulator.stats()["rabbitmq"]["connected"], timeout=30, message="simulator reconnected")
    simulator.faults(alice_instance.name, webhook_drop_rate=1.0)
    simulator.emit(alice_instance.name, "messages.update", receipt_data("READ", after))
    wait_until(lambda: Message.objects.filter(pk=second.pk, status=Status.READ).exists(), timeout=30)
    assert stack.processes["consumer"].alive()
    assert rows(after).get().channel == "RABBITMQ"
