"""The sandbox rule for events (issue 45 §1): an endpoint made with a TEST key gets TEST events only, one made
with a LIVE key LIVE events only. A message's status goes to its own environment; an inbound message from the
project's test number is a TEST event, from anyone else a LIVE one; a revocation goes to its consent's
environment, and a recipient's opt-out keyword ends their consent in both."""

from __future__ import annotations

import pytest

from callbacks import derive
from callbacks.models import Delivery, WebhookEndpoint
from messaging import lifecycle, opt_ins
from messaging.models import Environment, Message, OptIn
from tests.messaging.sending_helpers import RECIPIENT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("alice_instance")]


def endpoint(actor, environment: str, *event_types: str) -> WebhookEndpoint:
    client = actor.client(live=environment == Environment.LIVE)
    created = client.post("/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/hook",
                                                    "eventTypes": list(event_types or ["message.status"])}, format="json")
    assert created.status_code == 201, created.content
    return WebhookEndpoint.objects.get(pk=created.json()["id"])


def send(actor, environment: str, **extra) -> Message:
    live = environment == Environment.LIVE
    to = RECIPIENT if live else actor.project.test_number
    opt_ins.record(actor.project, to, "form", environment=environment)
    body = {"to": to, "category": "UTILITY", "text": "Order {{n}}", "variables": {"n": "1"}, **extra}
    response = actor.client(live=live).post("/v1/messages/send", body, format="json")
    assert response.status_code == 202, response.content
    return Message.objects.get(pk=response.json()["id"])


def message_ids(endpoint: WebhookEndpoint) -> set[str]:
    return {d.payload["data"]["messageId"] for d in Delivery.objects.filter(endpoint=endpoint)}


def test_each_endpoint_gets_the_status_changes_of_its_own_environment(alice):
    live_endpoint, test_endpoint = endpoint(alice, Environment.LIVE), endpoint(alice, Environment.TEST)
    live, test = send(alice, Environment.LIVE), send(alice, Environment.TEST)
    assert lifecycle.advance(live, "SENT") and lifecycle.advance(test, "SENT")
    derive.run()
    assert message_ids(live_endpoint) == {str(live.pk)}
    assert message_ids(test_endpoint) == {str(test.pk)}


def test_a_test_sends_callback_url_goes_through_the_test_per_message_endpoint(alice):
    live = send(alice, Environment.LIVE, callbackUrl="https://hooks.example.com/live")
    test = send(alice, Environment.TEST, callbackUrl="https://hooks.example.com/test")
    lifecycle.advance(live, "SENT")
    lifecycle.advance(test, "SENT")
    derive.run()
    by_environment = {e.environment: e for e in WebhookEndpoint.objects.filter(per_message=True)}
    assert set(by_environment) == {Environment.LIVE, Environment.TEST}
    assert message_ids(by_environment[Environment.LIVE]) == {str(live.pk)}
    assert message_ids(by_environment[Environment.TEST]) == {str(test.pk)}
    # each key lists its own per-message endpoint only
    listed = alice.client(live=False).get("/v1/webhook-endpoints").json()["data"]
    assert [e["id"] for e in listed] == [str(by_environment[Environment.TEST].pk)]


def inbox(n: int, sender: str, instance: str, text: str = "hello") -> None:
    from ingestion.models import IngestionEvent

    IngestionEvent.objects.create(
        dedup_key=f"{n:064d}", channel="WEBHOOK", event="messages.upsert", instance_name=instance, key_id=f"3EB0IN{n}",
        payload={"event": "messages.upsert", "instance": instance, "data": {
            "key": {"remoteJid": f"{sender.lstrip('+')}@s.whatsapp.net", "fromMe": False, "id": f"3EB0IN{n}"},
            "message": {"conversation": text}}},
    )


def test_an_inbound_message_from_the_test_number_is_a_test_event(alice, alice_instance):
    live_endpoint = endpoint(alice, Environment.LIVE, "message.inbound")
    test_endpoint = endpoint(alice, Environment.TEST, "message.inbound")
    derive.run()
    inbox(1, alice.project.test_number, alice_instance.name)
    inbox(2, RECIPIENT, alice_instance.name)
    derive.run()
    senders = lambda e: [d.payload["data"]["from"] for d in Delivery.objects.filter(endpoint=e)]  # noqa: E731
    assert senders(test_endpoint) == [alice.project.test_number]
    assert senders(live_endpoint) == [RECIPIENT]


def test_a_revocation_goes_to_its_consents_environment(alice):
    live_endpoint = endpoint(alice, Environment.LIVE, "opt_in.revoked")
    test_endpoint = endpoint(alice, Environment.TEST, "opt_in.revoked")
    opt_ins.record(alice.project, RECIPIENT, "form", environment=Environment.LIVE)
    opt_ins.record(alice.project, alice.project.test_number, "dev", environment=Environment.TEST)
    derive.run()
    assert alice.client().delete(f"/v1/opt-ins/{RECIPIENT}").status_code == 200
    assert alice.client(live=False).delete(f"/v1/opt-ins/{alice.project.test_number}").status_code == 200
    derive.run()
    phones = lambda e: [d.payload["data"]["phone"] for d in Delivery.objects.filter(endpoint=e)]  # noqa: E731
    assert phones(live_endpoint) == [RECIPIENT]
    assert phones(test_endpoint) == [alice.project.test_number]


def test_an_opt_out_keyword_ends_the_persons_consent_in_both_environments(alice, alice_instance):
    from messaging import opt_outs

    live_endpoint = endpoint(alice, Environment.LIVE, "opt_in.revoked")
    test_endpoint = endpoint(alice, Environment.TEST, "opt_in.revoked")
    number = alice.project.test_number
    opt_ins.record(alice.project, number, "form", environment=Environment.LIVE)
    opt_ins.record(alice.project, number, "dev", environment=Environment.TEST)
    derive.run()
    outcome = opt_outs.on_inbound(opt_outs.Inbound(alice_instance.name, number, "STOP", "inbox:1"))
    assert outcome == opt_outs.REVOKED
    assert not OptIn.objects.filter(revoked_at__isnull=True).exists()
    derive.run()
    assert Delivery.objects.filter(endpoint=live_endpoint).count() == 1
    assert Delivery.objects.filter(endpoint=test_endpoint).count() == 1
