"""/v1/webhook-endpoints and /v1/webhook-deliveries: the same auth, error envelope and scoping as every
/v1 route; bounded inputs; replays."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint
from tests.messaging.sending_helpers import send

URL = "http://127.0.0.1:9/hook"


def create(actor, **body):
    return actor.client().post("/v1/webhook-endpoints", {"url": URL, "eventTypes": ["message.status"], **body}, format="json")


def error_code(response) -> str:
    return response.json()["error"]["code"]


def test_create_list_retrieve_update_delete(alice):
    created = create(alice, description="orders")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["secret"].startswith("whsec_") and body["enabled"] and body["eventTypes"] == ["message.status"]
    assert body["circuit"] == {"state": "closed", "failures": 0, "retryAt": None}
    endpoint_id = body["id"]

    listed = alice.client().get("/v1/webhook-endpoints").json()["data"]
    assert [e["id"] for e in listed] == [endpoint_id] and "secret" not in listed[0]
    assert alice.client().get(f"/v1/webhook-endpoints/{endpoint_id}").json()["description"] == "orders"

    updated = alice.client().patch(
        f"/v1/webhook-endpoints/{endpoint_id}", {"eventTypes": ["opt_in.revoked", "message.inbound"], "enabled": False}, format="json"
    )
    assert updated.status_code == 200, updated.content
    assert updated.json()["eventTypes"] == ["message.inbound", "opt_in.revoked"]
    assert not updated.json()["enabled"] and updated.json()["disabledReason"]

    assert alice.client().delete(f"/v1/webhook-endpoints/{endpoint_id}").status_code == 204
    assert not WebhookEndpoint.objects.exists()


def test_another_projects_endpoint_is_not_found(alice, carol):
    endpoint_id = create(alice).json()["id"]
    for response in (
        carol.client().get(f"/v1/webhook-endpoints/{endpoint_id}"),
        carol.client().patch(f"/v1/webhook-endpoints/{endpoint_id}", {"enabled": False}, format="json"),
        carol.client().delete(f"/v1/webhook-endpoints/{endpoint_id}"),
        carol.client().post(f"/v1/webhook-endpoints/{endpoint_id}/rotate-secret"),
        carol.client().get(f"/v1/webhook-endpoints/{endpoint_id}/deliveries"),
    ):
        assert response.status_code == 404 and error_code(response) == "not_found"
    assert carol.client().get("/v1/webhook-endpoints").json()["data"] == []


def test_a_key_is_required():
    from rest_framework.test import APIClient

    response = APIClient().get("/v1/webhook-endpoints")
    assert response.status_code == 401 and error_code(response) == "unauthorized"


@pytest.mark.parametrize(
    "body",
    [
        {"eventTypes": ["message.sent"]},
        {"eventTypes": []},
        {"eventTypes": "message.status"},
        {"url": "http://127.0.0.1/" + "a" * 2048},
        {"url": ""},
        {"secret": "whsec_mine"},
        {"description": "d" * 201},
    ],
)
def test_bad_input_is_a_400_and_stores_nothing(alice, body):
    response = create(alice, **body)
    assert response.status_code == 400, response.content
    assert error_code(response) == "invalid_request"
    assert not WebhookEndpoint.objects.exists()


def test_an_invalid_url_is_a_422(alice):
    response = create(alice, url="ftp://example.com/")
    assert response.status_code == 422 and error_code(response) == "invalid_url"


def test_the_number_of_endpoints_is_bounded(settings, alice):
    settings.CALLBACKS_MAX_ENDPOINTS_PER_PROJECT = 2
    assert create(alice).status_code == 201 and create(alice).status_code == 201
    third = create(alice)
    assert third.status_code == 409 and error_code(third) == "too_many_endpoints"
    assert third.json()["error"]["details"] == {"limit": 2}


def owed(endpoint_id: str, status: str, created_at=None) -> Delivery:
    delivery = Delivery.objects.create(
        endpoint_id=endpoint_id, event_type="message.status", source=f"event:{Delivery.objects.count()}",
        payload={"type": "message.status"}, status=status, attempts=8,
    )
    if created_at:
        Delivery.objects.filter(pk=delivery.pk).update(created_at=created_at)
    DeliveryAttempt.objects.create(delivery=delivery, url=URL, response_status=500, response_body="no", duration_ms=3)
    return delivery


def test_deliveries_list_their_attempts_and_page(alice):
    endpoint_id = create(alice).json()["id"]
    for _ in range(3):
        owed(endpoint_id, "FAILED")
    first = alice.client().get(f"/v1/webhook-endpoints/{endpoint_id}/deliveries?limit=2").json()
    assert len(first["data"]) == 2 and first["nextCursor"]
    assert first["data"][0]["attemptLog"][0]["responseStatus"] == 500
    rest = alice.client().get(f"/v1/webhook-endpoints/{endpoint_id}/deliveries?limit=2&cursor={first['nextCursor']}").json()
    assert len(rest["data"]) == 1 and rest["nextCursor"] is None
    bad = alice.client().get(f"/v1/webhook-endpoints/{endpoint_id}/deliveries?cursor=nope")
    assert bad.status_code == 400


def test_replay_one_delivery_and_the_failed_ones_since_a_time(alice, carol):
    endpoint_id = create(alice).json()["id"]
    old = owed(endpoint_id, "FAILED", created_at=timezone.now() - timedelta(days=2))
    recent = owed(endpoint_id, "FAILED")
    done = owed(endpoint_id, "SUCCEEDED")

    response = alice.client().post(f"/v1/webhook-deliveries/{old.pk}/replay", format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "PENDING" and response.json()["attempts"] == 0
    assert response.json()["webhookId"] == old.webhook_id  # same id: a receiver drops a copy it has
    assert carol.client().post(f"/v1/webhook-deliveries/{recent.pk}/replay").status_code == 404

    Delivery.objects.filter(pk=old.pk).update(status="FAILED")
    since = (timezone.now() - timedelta(days=1)).isoformat()
    replayed = alice.client().post(f"/v1/webhook-endpoints/{endpoint_id}/replay-failed", {"since": since}, format="json")
    assert replayed.status_code == 200 and replayed.json() == {"replayed": 1}
    statuses = {d.pk: d.status for d in Delivery.objects.all()}
    assert statuses == {old.pk: "FAILED", recent.pk: "PENDING", done.pk: "SUCCEEDED"}
    missing = alice.client().post(f"/v1/webhook-endpoints/{endpoint_id}/replay-failed", {}, format="json")
    assert missing.status_code == 400


def test_a_disabled_endpoint_refuses_replays_until_enabled(alice):
    endpoint_id = create(alice).json()["id"]
    failed = owed(endpoint_id, "FAILED")
    alice.client().patch(f"/v1/webhook-endpoints/{endpoint_id}", {"enabled": False}, format="json")
    refused = alice.client().post(f"/v1/webhook-deliveries/{failed.pk}/replay")
    assert refused.status_code == 409 and error_code(refused) == "endpoint_disabled"
    alice.client().patch(f"/v1/webhook-endpoints/{endpoint_id}", {"enabled": True}, format="json")
    assert alice.client().post(f"/v1/webhook-deliveries/{failed.pk}/replay").status_code == 200


def test_the_routes_are_in_the_openapi_schema(client):
    schema = client.get("/v1/schema/", HTTP_ACCEPT="application/json").json()
    paths = schema["paths"]
    for path in (
        "/v1/webhook-endpoints",
        "/v1/webhook-endpoints/{endpoint_id}",
        "/v1/webhook-endpoints/{endpoint_id}/rotate-secret",
        "/v1/webhook-endpoints/{endpoint_id}/deliveries",
        "/v1/webhook-endpoints/{endpoint_id}/replay-failed",
        "/v1/webhook-deliveries/{delivery_id}/replay",
    ):
        assert path in paths, path


def test_a_message_shows_the_callback_url_it_was_sent_with(alice, alice_instance):
    with_url = send(alice, callbackUrl="https://hooks.example.com/pilot?order=42")
    without = send(alice, to="+5511988887778")

    shown = alice.client().get(f"/v1/messages/{with_url.pk}").json()
    assert shown["callbackUrl"] == "https://hooks.example.com/pilot?order=42"
    assert alice.client().get(f"/v1/messages/{without.pk}").json()["callbackUrl"] is None
    listed = {m["id"]: m["callbackUrl"] for m in alice.client().get("/v1/messages").json()["data"]}
    assert listed == {str(with_url.pk): "https://hooks.example.com/pilot?order=42", str(without.pk): None}


def test_the_openapi_schema_describes_a_messages_callback_url(client):
    schemas = client.get("/v1/schema/", HTTP_ACCEPT="application/json").json()["components"]["schemas"]
    for name in ("Message", "MessageDetail"):
        field = schemas[name]["properties"]["callbackUrl"]
        assert field["type"] == "string" and field["format"] == "uri" and field["nullable"] is True, field
        assert "callbackUrl" in field["description"]
