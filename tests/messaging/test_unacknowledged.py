"""Sends WhatsApp never acknowledged (issue 47 §6): a message SENT with no SERVER_ACK (or later receipt) within
ACK_TIMEOUT_SECONDS is flagged by the status sync pass (a timeline line, the API, the dashboard, a per-instance
count and gauge), asked about first, and no longer counts once a receipt arrives (the receipt supersedes the flag;
its time stays as history)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import requests
from django.test import Client
from django.utils import timezone

from ingestion import handlers, inbox
from messaging import opt_ins, status_sync, unacknowledged
from messaging.models import Message
from messaging.sending import worker
from tests.ingestion.helpers import receipt
from tests.messaging.sending_helpers import events, open_on_simulator, send
from tests.support.simulator import wait_until

TOKEN = "metrics-token-for-the-tests-0123456789abcdef"


def sent_ago(simulator: Any, alice: Any, instance: Any, seconds: float, **faults: Any) -> Message:
    """A message sent through the simulator whose receipts never come, `seconds` ago."""
    open_on_simulator(simulator, instance, never_ack_rate=1.0, **faults)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "sent"
    Message.objects.filter(pk=message.pk).update(sent_at=timezone.now() - timedelta(seconds=seconds))
    message.refresh_from_db()
    return message


def body(alice: Any, message: Message) -> dict[str, Any]:
    answer = alice.client().get(f"/v1/messages/{message.pk}")
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_a_send_never_acknowledged_is_flagged_by_the_sync_pass(simulator, alice, alice_instance, settings):
    settings.ACK_TIMEOUT_SECONDS = 600
    overdue = sent_ago(simulator, alice, alice_instance, 601)
    recent = sent_ago(simulator, alice, alice_instance, 30)

    status_sync.run_batch()

    overdue.refresh_from_db()
    assert overdue.status == "SENT" and overdue.unacknowledged_at is not None
    [line] = events(overdue, "UNACKNOWLEDGED")
    assert line["ackTimeoutSeconds"] == 600 and line["instance"] == alice_instance.name
    shown = body(alice, overdue)
    assert shown["unacknowledged"] is True and shown["unacknowledgedAt"]
    assert body(alice, recent)["unacknowledged"] is False and body(alice, recent)["unacknowledgedAt"] is None
    # flagged once, however many passes
    status_sync.run_batch()
    assert len(events(overdue, "UNACKNOWLEDGED")) == 1


def test_a_receipt_supersedes_the_flag(simulator, alice, alice_instance, settings):
    settings.ACK_TIMEOUT_SECONDS = 600
    message = sent_ago(simulator, alice, alice_instance, 700)
    status_sync.run_batch()
    assert unacknowledged.count_for(alice_instance) == 1

    event, _ = inbox.record("WEBHOOK", receipt("SERVER_ACK", key_id=message.evolution_message_id))
    handlers.apply(event)

    shown = body(alice, message)
    assert shown["status"] == "SERVER_ACK" and shown["unacknowledged"] is False
    assert shown["unacknowledgedAt"]  # when it was flagged: history
    assert unacknowledged.count_for(alice_instance) == 0


def test_a_message_with_a_receipt_in_time_is_never_flagged(simulator, alice, alice_instance, settings):
    settings.ACK_TIMEOUT_SECONDS = 600
    message = sent_ago(simulator, alice, alice_instance, 700)
    event, _ = inbox.record("WEBHOOK", receipt("SERVER_ACK", key_id=message.evolution_message_id))
    handlers.apply(event)

    status_sync.run_batch()

    assert Message.objects.get(pk=message.pk).unacknowledged_at is None


def test_status_sync_asks_about_the_flagged_ones_first(simulator, alice, alice_instance, settings):
    settings.ACK_TIMEOUT_SECONDS = 600
    settings.STATUS_SYNC_AFTER_SECONDS = 60
    # never checked: the plain order (never checked first) would take them before one checked a while ago
    for _ in range(3):
        sent_ago(simulator, alice, alice_instance, 120)
    flagged = sent_ago(simulator, alice, alice_instance, 700)
    Message.objects.filter(pk=flagged.pk).update(status_checked_at=timezone.now() - timedelta(seconds=100))
    unacknowledged.flag(timezone.now())

    first = status_sync.candidates(timezone.now(), 1)

    assert [m.pk for m in first] == [flagged.pk]


def test_the_count_per_instance_reads_the_recent_flagged_sends(simulator, alice, alice_instance, settings):
    settings.ACK_TIMEOUT_SECONDS = 600
    for _ in range(2):
        sent_ago(simulator, alice, alice_instance, 700)
    old = sent_ago(simulator, alice, alice_instance, 700)
    unacknowledged.flag(timezone.now())
    Message.objects.filter(pk=old.pk).update(sent_at=timezone.now() - timedelta(days=3))

    assert unacknowledged.by_instance() == {alice_instance.pk: 2}
    assert unacknowledged.by_instance(window=timedelta(days=4)) == {alice_instance.pk: 3}
    assert unacknowledged.count_for(alice_instance) == 2


def test_the_metric_and_the_dashboard_show_them(transactional_db, simulator, alice, alice_instance, bob, settings, client):
    # transactional_db: the scrape reads on a thread of its own, with its own connection
    settings.ACK_TIMEOUT_SECONDS = 600
    settings.METRICS_TOKEN = TOKEN
    message = sent_ago(simulator, alice, alice_instance, 700)
    status_sync.run_batch()

    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    assert f'pilot_status_unacknowledged_sends{{name="{alice_instance.name}"}} 1.0' in text

    browser = Client()
    browser.force_login(bob)
    status = browser.get(f"/dashboard/p/{alice.project.pk}/messages/{message.pk}/status.json").json()
    assert status["unacknowledged"] is True and status["unacknowledgedAt"]
    page = browser.get(f"/dashboard/p/{alice.project.pk}/").content.decode()
    assert 'id="unacknowledged-alice-main"' in page and "1 sent, never acknowledged" in page


def test_the_schema_documents_the_fields():
    from pathlib import Path

    api = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    assert "unacknowledged" in api and "unacknowledgedAt" in api and "ACK_TIMEOUT_SECONDS" in api


# ---- the real stack -------------------------------------------------------------------------

@pytest.mark.stack
def test_a_send_the_simulator_never_acknowledges_is_flagged(stack, simulator, alice, alice_instance, settings):
    # given: an instance whose sends WhatsApp accepts and never acknowledges (the simulator's never_ack_rate)
    simulator.register(alice_instance, stack.webhook_url)
    open_on_simulator(simulator, alice_instance, never_ack_rate=1.0)
    opt_ins.record(alice.project, "+5511988887777", "checkout")
    answer = requests.post(f"{stack.web_url}/v1/messages/send", headers={"Authorization": f"Bearer {alice.live_key}"},
                           json={"to": "+5511988887777", "category": "UTILITY", "text": "Your order shipped",
                                 "typing": "off"}, timeout=30)
    assert answer.status_code == 202, answer.text
    message_id = answer.json()["id"]
    wait_until(lambda: Message.objects.get(pk=message_id).status == "SENT", timeout=30, message="sent")
    assert [s["wa_outcome"] for s in simulator.sends(instance=alice_instance.name)] == ["unacknowledged"]

    # when: ACK_TIMEOUT_SECONDS pass without a receipt, and the status sync pass runs
    settings.ACK_TIMEOUT_SECONDS = 1
    wait_until(lambda: timezone.now() - Message.objects.get(pk=message_id).sent_at > timedelta(seconds=1.5),
               timeout=10, message="the ack timeout passed")
    status_sync.run_batch()

    # then: the API says so
    shown = requests.get(f"{stack.web_url}/v1/messages/{message_id}",
                         headers={"Authorization": f"Bearer {alice.live_key}"}, timeout=30).json()
    assert shown["status"] == "SENT" and shown["unacknowledged"] is True
    assert unacknowledged.count_for(alice_instance) == 1
