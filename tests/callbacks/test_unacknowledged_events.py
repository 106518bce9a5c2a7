"""`message.unacknowledged` (issue 47 §6): an endpoint that asks for it gets one delivery per message the status sync
pass flagged as sent and never acknowledged by WhatsApp; the API accepts it as an event type."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks import derive
from callbacks.models import Delivery, WebhookEndpoint
from messaging import lifecycle, unacknowledged
from messaging.models import Message
from tests.callbacks.test_api import create
from tests.messaging.sending_helpers import RECIPIENT, send

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("alice_instance"), pytest.mark.serial]


def flagged(actor, **extra) -> Message:
    message = send(actor, metadata={"order": "42"}, **extra)
    assert lifecycle.advance(message, "SENT")
    Message.objects.filter(pk=message.pk).update(sent_at=timezone.now() - timedelta(hours=1))
    assert unacknowledged.flag(timezone.now()) >= 1
    message.refresh_from_db()
    return message


def test_a_flagged_message_owes_one_delivery_to_the_endpoints_that_ask(alice, carol):
    asks = WebhookEndpoint.objects.create(project=alice.project, url="http://127.0.0.1:9/hook",
                                          event_types=["message.unacknowledged"])
    status_only = WebhookEndpoint.objects.create(project=alice.project, url="http://127.0.0.1:9/other",
                                                 event_types=["message.status"])
    carols = WebhookEndpoint.objects.create(project=carol.project, url="http://127.0.0.1:9/c",
                                            event_types=["message.unacknowledged"])
    message = flagged(alice)

    derive.run()
    derive.run()

    [delivery] = Delivery.objects.filter(endpoint=asks)
    assert delivery.event_type == "message.unacknowledged" and delivery.message_id == message.pk
    data = delivery.payload["data"]
    assert delivery.payload["type"] == "message.unacknowledged"
    assert data["messageId"] == str(message.pk) and data["status"] == "SENT" and data["to"] == RECIPIENT
    assert data["instance"] == "alice-main" and data["metadata"] == {"order": "42"}
    assert data["sentAt"] and data["unacknowledgedAt"] and data["ackTimeoutSeconds"] > 0
    assert not Delivery.objects.filter(endpoint=status_only, event_type="message.unacknowledged").exists()
    assert not Delivery.objects.filter(endpoint=carols).exists()


def test_the_api_accepts_the_event_type(alice, settings):
    answer = create(alice, eventTypes=["message.unacknowledged", "message.status"])
    assert answer.status_code == 201, answer.content
    assert answer.json()["eventTypes"] == ["message.status", "message.unacknowledged"]
