"""POST /api/internal/webhook: Evolution's authentication, the inbox, forward-only statuses."""

from __future__ import annotations

import copy
import json
import time
from datetime import timedelta
from pathlib import Path

import jwt
import pytest
from django.test import Client
from django.utils import timezone

from ingestion.models import IngestionEvent
from messaging.models import Message, Status
from pilot_status import metrics

SAMPLES = Path(__file__).resolve().parents[1] / "messaging" / "samples"
URL = "/api/internal/webhook"
KEY_ID = "3EB0C431C26A1916E07A4B"


def sample(name: str, instance: str = "alice-main", status: str | None = None) -> dict:
    payload = json.loads((SAMPLES / name).read_text())
    payload["instance"] = instance
    if status:
        payload["data"]["status"] = status
    return payload


@pytest.fixture
def sent_message(alice, alice_instance):
    return Message.objects.create(
        project=alice.project,
        environment="LIVE",
        category="UTILITY",
        to="+5511999999999",
        template="hi",
        text="hi",
        instance=alice_instance,
        deliver_until=timezone.now() + timedelta(hours=1),
        status=Status.SENT,
        sent_at=timezone.now(),
        evolution_message_id=KEY_ID,
    )


def post(payload: dict, path: str = URL, **headers) -> object:
    return Client().post(path, data=json.dumps(payload), content_type="application/json", **headers)


def token_header(instance) -> dict:
    return {"HTTP_X_WEBHOOK_TOKEN": instance.webhook_token}


def counter(name: str) -> int:
    return int(metrics.redis().get(metrics.EVOLUTION + name) or 0)


def test_a_receipt_moves_the_message_forward(sent_message, alice_instance):
    response = post(sample("webhook.messages.update.DELIVERY_ACK.json"), **token_header(alice_instance))
    assert response.status_code == 200
    assert response.json() == {"status": "processed"}
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED
    event = IngestionEvent.objects.get()
    assert event.channel == "WEBHOOK" and event.processed_at is not None
    assert counter("webhook:processed") == 1


def test_the_same_event_twice_is_processed_once(sent_message, alice_instance):
    payload = sample("webhook.messages.update.SERVER_ACK.json")
    post(payload, **token_header(alice_instance))
    retried = copy.deepcopy(payload)
    retried["date_time"] = "2025-10-21T11:49:00.000Z"  # Evolution's retry has a new date_time
    response = post(retried, **token_header(alice_instance))
    assert response.json() == {"status": "skipped"}
    assert IngestionEvent.objects.count() == 1
    assert counter("webhook:skipped") == 1
    assert sent_message.events.filter(kind="STATUS").count() == 1


def test_a_late_receipt_never_moves_a_message_back(sent_message, alice_instance):
    for status in ("READ", "DELIVERY_ACK", "SERVER_ACK"):
        post(sample("webhook.messages.update.READ.json", status=status), **token_header(alice_instance))
    sent_message.refresh_from_db()
    assert sent_message.status == Status.READ
    assert IngestionEvent.objects.count() == 3


def test_an_error_receipt_fails_the_message_into_the_dead_letters(sent_message, alice_instance):
    post(sample("webhook.messages.update.ERROR.json"), **token_header(alice_instance))
    sent_message.refresh_from_db()
    assert sent_message.status == Status.FAILED
    assert sent_message.failure_reason == "REJECTED"
    assert sent_message.dead_letter.reason == "REJECTED"


def test_the_by_events_path_is_accepted(sent_message, alice_instance):
    response = post(
        sample("webhook.messages.update.SERVER_ACK.json"), f"{URL}/messages-update", **token_header(alice_instance)
    )
    assert response.status_code == 200
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SERVER_ACK


def test_jwt_key_authentication(sent_message, alice_instance):
    now = int(time.time())
    token = jwt.encode(
        {"iat": now, "exp": now + 600, "app": "evolution", "action": "webhook"},
        alice_instance.webhook_token,
        algorithm="HS256",
    )
    response = post(sample("webhook.messages.update.SERVER_ACK.json"), HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200


def test_body_apikey_authentication(sent_message, alice_instance):
    payload = sample("webhook.messages.update.SERVER_ACK.json")
    payload["apikey"] = "TOKEN-ALICE-MAIN"
    assert post(payload).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{}, {"HTTP_X_WEBHOOK_TOKEN": "wrong"}, {"HTTP_AUTHORIZATION": "Bearer not-a-jwt"}],
)
def test_unauthenticated_events_are_401_and_store_nothing(sent_message, alice_instance, headers):
    payload = sample("webhook.messages.update.DELIVERY_ACK.json")
    payload["apikey"] = "wrong"
    response = post(payload, **headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert IngestionEvent.objects.count() == 0
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


def test_another_instances_token_is_refused(sent_message, alice_instance, carol):
    from tests.conftest import add_instance

    other = add_instance(carol.project, "carol-main")
    response = post(sample("webhook.messages.update.DELIVERY_ACK.json"), **token_header(other))
    assert response.status_code == 401


def test_a_forged_already_saved_is_refused(sent_message, alice_instance):
    payload = sample("webhook.messages.update.DELIVERY_ACK.json")
    payload["already_saved"] = True
    for headers in ({}, {"HTTP_X_INTERNAL_WEBHOOK_SECRET": "guess"}, token_header(alice_instance)):
        assert post(payload, **headers).status_code == 401
    assert IngestionEvent.objects.count() == 0
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


def test_not_an_event_is_400(alice_instance):
    for payload in ({}, {"event": "x"}, [1, 2]):
        response = Client().post(URL, data=json.dumps(payload), content_type="application/json")
        assert response.status_code == 400
    response = Client().post(URL, data="{nope", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    assert IngestionEvent.objects.count() == 0


def test_get_is_405_json(db):
    response = Client().get(URL)
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_a_receipt_before_the_send_commit_is_applied_when_the_send_lands(alice, alice_instance):
    from messaging import lifecycle

    # the ack arrives first: its message does not know its Evolution id yet
    message = Message.objects.create(
        project=alice.project, environment="LIVE", category="UTILITY", to="+5511999999999", template="hi",
        text="hi", instance=alice_instance, deliver_until=timezone.now() + timedelta(hours=1), status=Status.SENDING,
    )
    post(sample("webhook.messages.update.DELIVERY_ACK.json"), **token_header(alice_instance))
    event = IngestionEvent.objects.get()
    assert event.processed_at is None and event.outcome == "waiting_for_message"

    lifecycle.mark_sent(message, None, KEY_ID, "5511999999999@s.whatsapp.net", {})

    message.refresh_from_db()
    assert message.status == Status.DELIVERED
    event.refresh_from_db()
    assert event.processed_at is not None


def test_connection_update_records_the_instance_state(alice_instance):
    post(sample("webhook.connection.update.close.json"), **token_header(alice_instance))
    alice_instance.refresh_from_db()
    assert alice_instance.connection_state == "close"
    post(sample("webhook.connection.update.open.json"), **token_header(alice_instance))
    alice_instance.refresh_from_db()
    assert alice_instance.connection_state == "open"
