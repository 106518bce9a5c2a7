"""The sandbox rule (issue 45 §1): a project's TEST key and LIVE key see disjoint worlds.

Every /v1 route, called with the TEST key and a LIVE object's id, answers 404 as for another project's
object and changes nothing (the routes are read from the URLconfs, so a new one is covered the day it is
added); lists show only the key's own environment; an Idempotency-Key is one per environment; a TEST key
neither records nor revokes a LIVE consent.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

from django.urls import URLPattern
from django.utils import timezone

from callbacks.api import urls as callbacks_urls
from callbacks.models import Delivery, WebhookEndpoint
from messaging import opt_ins
from messaging.api import urls as api_urls
from messaging.models import DeadLetter, Environment, Instance, Message, OptIn

METHODS = ("get", "post", "put", "patch", "delete")
LIVE_RECIPIENT = "+5511988887777"


def failed(actor, instance, environment: str, to: str = LIVE_RECIPIENT) -> DeadLetter:
    message = Message.objects.create(
        project=actor.project, environment=environment, category="UTILITY", to=to, template="hi", text="hi",
        instance=instance, deliver_until=timezone.now() + timedelta(hours=1), status="FAILED",
        failure_reason="INVALID_RECIPIENT",
    )
    return DeadLetter.objects.create(message=message, project=actor.project, reason="INVALID_RECIPIENT")


def live_objects(alice, alice_instance) -> dict[str, str]:
    dead = failed(alice, alice_instance, Environment.LIVE)
    opt_ins.record(alice.project, LIVE_RECIPIENT, "form", environment=Environment.LIVE)
    created = alice.client().post("/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/hook", "eventTypes": ["message.status"]},
                                  format="json")
    assert created.status_code == 201, created.content
    endpoint = WebhookEndpoint.objects.get(pk=created.json()["id"])
    delivery = Delivery.objects.create(endpoint=endpoint, event_type="message.status", source="event:1",
                                       message_id=dead.message_id, payload={"type": "message.status"}, status="FAILED")
    return {"message_id": str(dead.message_id), "phone": LIVE_RECIPIENT, "dead_letter_id": str(dead.pk),
            "endpoint_id": str(endpoint.pk), "delivery_id": str(delivery.pk), "name": alice_instance.name}


def snapshot():
    return (
        sorted(Message.objects.values_list("pk", "status", "to", "attempts")),
        sorted(DeadLetter.objects.values_list("pk", "status")),
        sorted(OptIn.objects.values_list("pk", "revoked_at")),
        sorted(WebhookEndpoint.objects.values_list("pk", "url", "enabled", "event_types", "encrypted_secret")),
        sorted(Delivery.objects.values_list("pk", "status", "attempts")),
        sorted(Instance.objects.values_list("pk", "send_profile", "send_policy")),
    )


def routes():
    for prefix, patterns in (("/v1/", api_urls.urlpatterns), ("/v1/", callbacks_urls.urlpatterns)):
        for pattern in patterns:
            assert isinstance(pattern, URLPattern)
            if pattern.pattern.converters:
                yield prefix, pattern


def test_a_test_key_gets_404_on_every_route_with_live_ids(alice, alice_instance):
    ids = live_objects(alice, alice_instance)
    before = snapshot()
    test_key = alice.client(live=False)
    checked = 0
    for prefix, pattern in routes():
        params = list(pattern.pattern.converters)
        missing = [p for p in params if p not in ids]
        assert not missing, f"no LIVE object for path parameter(s) {missing} of {pattern.pattern}"
        path = prefix + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: ids[m.group(1)], str(pattern.pattern))
        view = pattern.callback.view_class
        for method in METHODS:
            if not hasattr(view, method):
                continue
            body = {"to": alice.project.test_number} if path.endswith("/resend") else {}
            if path.endswith("/replay-failed"):
                body = {"since": (timezone.now() - timedelta(days=1)).isoformat()}
            response = getattr(test_key, method)(path, body, format="json")
            if method == "get":
                assert alice.client().get(path).status_code == 200, path  # the route was really hit
            assert response.status_code == 404, f"{method.upper()} {path} → {response.status_code} {response.content!r}"
            assert response.json()["error"]["code"] == "not_found"
            checked += 1
    assert checked >= 10
    assert snapshot() == before


def test_a_live_key_gets_404_on_test_objects_too(alice, alice_instance):
    dead = failed(alice, alice_instance, Environment.TEST, to=alice.project.test_number)
    live = alice.client()
    assert live.get(f"/v1/messages/{dead.message_id}").status_code == 404
    assert live.get(f"/v1/messages/{dead.message_id}/events").status_code == 404
    assert live.post(f"/v1/dead-letters/{dead.pk}/dismiss", {}, format="json").status_code == 404
    dead.refresh_from_db()
    assert dead.status == "OPEN"


def test_lists_show_the_keys_own_environment_only(alice, alice_instance):
    live = failed(alice, alice_instance, Environment.LIVE)
    test = failed(alice, alice_instance, Environment.TEST, to=alice.project.test_number)
    for client, own in ((alice.client(), live), (alice.client(live=False), test)):
        messages = client.get("/v1/messages").json()["data"]
        assert [m["id"] for m in messages] == [str(own.message_id)]
        letters = client.get("/v1/dead-letters").json()["data"]
        assert [d["id"] for d in letters] == [own.pk]


def test_a_test_key_cannot_resend_a_live_dead_letter_to_a_number_of_its_choice(alice, alice_instance):
    dead = failed(alice, alice_instance, Environment.LIVE)
    opt_ins.record(alice.project, alice.project.test_number, "dev", environment=Environment.TEST)
    before = snapshot()
    response = alice.client(live=False).post(f"/v1/dead-letters/{dead.pk}/resend", {"to": alice.project.test_number},
                                             format="json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert snapshot() == before


def test_endpoints_are_listed_in_their_own_environment(alice):
    url = "http://127.0.0.1:9/hook"
    live = alice.client().post("/v1/webhook-endpoints", {"url": url, "eventTypes": ["message.status"]}, format="json")
    test = alice.client(live=False).post("/v1/webhook-endpoints", {"url": url, "eventTypes": ["message.status"]},
                                         format="json")
    assert live.status_code == test.status_code == 201
    assert [e["id"] for e in alice.client().get("/v1/webhook-endpoints").json()["data"]] == [live.json()["id"]]
    assert [e["id"] for e in alice.client(live=False).get("/v1/webhook-endpoints").json()["data"]] == [test.json()["id"]]
    assert WebhookEndpoint.objects.get(pk=test.json()["id"]).environment == Environment.TEST


def test_the_endpoint_limit_is_counted_per_environment(alice, settings):
    settings.CALLBACKS_MAX_ENDPOINTS_PER_PROJECT = 1
    body = {"url": "http://127.0.0.1:9/hook", "eventTypes": ["message.status"]}
    assert alice.client().post("/v1/webhook-endpoints", body, format="json").status_code == 201
    # The LIVE endpoint does not use up the TEST world's room, nor the reverse.
    assert alice.client(live=False).post("/v1/webhook-endpoints", body, format="json").status_code == 201
    assert alice.client().post("/v1/webhook-endpoints", body, format="json").status_code == 409


def send_body(to: str) -> dict:
    return {"to": to, "category": "UTILITY", "text": "Order {{n}}", "variables": {"n": "1"}}


def test_an_idempotency_key_is_one_per_environment(alice, alice_instance):
    opt_ins.record(alice.project, alice.project.test_number, "dev", environment=Environment.TEST)
    opt_ins.record(alice.project, alice.project.test_number, "form", environment=Environment.LIVE)
    key = {"HTTP_IDEMPOTENCY_KEY": "order-42"}
    test = alice.client(live=False).post("/v1/messages/send", send_body(alice.project.test_number), format="json", **key)
    assert test.status_code == 202, test.content
    # Another body under the same key: a conflict only where the key was used.
    other = send_body(alice.project.test_number) | {"text": "Other {{n}}"}
    live = alice.client().post("/v1/messages/send", other, format="json", **key)
    assert live.status_code == 202, live.content
    assert live.json()["id"] != test.json()["id"]
    assert Message.objects.get(pk=live.json()["id"]).environment == Environment.LIVE
    replay = alice.client(live=False).post("/v1/messages/send", send_body(alice.project.test_number), format="json", **key)
    assert replay.status_code == 202 and replay.json()["id"] == test.json()["id"]


def test_an_idempotency_key_is_one_per_environment_on_a_refused_body_too(alice, alice_instance):
    opt_ins.record(alice.project, alice.project.test_number, "dev", environment=Environment.TEST)
    key = {"HTTP_IDEMPOTENCY_KEY": "order-43"}
    assert alice.client(live=False).post("/v1/messages/send", send_body(alice.project.test_number), format="json",
                                         **key).status_code == 202
    # A body the payload check refuses: the LIVE key has no answer under this key, so the payload answers.
    refused = alice.client().post("/v1/messages/send", {"to": "nope"}, format="json", **key)
    assert refused.status_code == 400, refused.content


def test_a_test_key_neither_revokes_nor_records_a_live_consent(alice, alice_instance):
    opt_ins.record(alice.project, LIVE_RECIPIENT, "form", environment=Environment.LIVE)
    revoked = alice.client(live=False).delete(f"/v1/opt-ins/{LIVE_RECIPIENT}")
    assert revoked.status_code == 404 and revoked.json()["error"]["code"] == "not_found"
    assert OptIn.objects.get(phone=LIVE_RECIPIENT).revoked_at is None

    other = "+5511977776666"
    recorded = alice.client(live=False).post("/v1/opt-ins", {"phone": other, "source": "test"}, format="json")
    assert recorded.status_code == 201
    assert OptIn.objects.get(phone=other).environment == Environment.TEST
    # The TEST consent does not let a LIVE send through.
    refused = alice.client().post("/v1/messages/send", send_body(other), format="json")
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "opt_in_required"


def test_a_live_consent_is_the_live_keys_to_revoke(alice, alice_instance):
    opt_ins.record(alice.project, LIVE_RECIPIENT, "form", environment=Environment.LIVE)
    assert alice.client().delete(f"/v1/opt-ins/{LIVE_RECIPIENT}").status_code == 200
    assert OptIn.objects.get(phone=LIVE_RECIPIENT).revoked_at is not None


def test_a_test_send_needs_a_test_consent(alice, alice_instance):
    opt_ins.record(alice.project, alice.project.test_number, "form", environment=Environment.LIVE)
    refused = alice.client(live=False).post("/v1/messages/send", send_body(alice.project.test_number), format="json")
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "opt_in_required"
    assert alice.client(live=False).post("/v1/opt-ins", {"phone": alice.project.test_number, "source": "dev"},
                                         format="json").status_code == 201
    ok = alice.client(live=False).post("/v1/messages/send", send_body(alice.project.test_number), format="json")
    assert ok.status_code == 202, ok.content


def test_unknown_ids_are_404_for_both_keys(alice):
    for client in (alice.client(), alice.client(live=False)):
        assert client.get(f"/v1/messages/{uuid.uuid4()}").status_code == 404
