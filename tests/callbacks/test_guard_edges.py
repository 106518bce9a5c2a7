"""The edges of the SSRF guard (docs/security.md "Callback bounds"): one refusal that names no address and
tells no unresolvable host from a forbidden one, the details in the server's log only; a send's
callbackUrl refused at accept; ports 80 and 443 and a documented list; replays limited per endpoint."""

from __future__ import annotations

import logging

import pytest

from callbacks import addresses, deliver
from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint
from messaging.models import Message
from tests.messaging.sending_helpers import RECIPIENT
from tests.support.receiver import Receiver

# The same answer for a private literal, a name of our own network and a name that does not resolve.
HIDDEN = ["http://10.0.0.5/hook", "http://127.0.0.1/hook", "http://localhost/hook", "http://no-such-host.invalid/hook",
          "http://169.254.169.254/latest/meta-data/", "http://metadata.google.internal/"]


@pytest.fixture
def guarded(settings):
    settings.CALLBACKS_ALLOW_PRIVATE_ADDRESSES = False


def create(actor, url: str):
    return actor.client().post("/v1/webhook-endpoints", {"url": url, "eventTypes": ["message.status"]}, format="json")


def test_every_refused_host_gets_one_answer_that_names_no_address(guarded, alice, caplog):
    caplog.set_level(logging.INFO, logger="callbacks")
    answers = set()
    for url in HIDDEN:
        response = create(alice, url)
        assert response.status_code == 422, (url, response.content)
        error = response.json()["error"]
        answers.add((error["code"], error["message"]))
        assert error["details"] == {"url": url}
    assert answers == {("forbidden_address", addresses.GENERIC_REFUSAL)}
    for written in ("10.0.0.5", "127.0.0.1", "169.254", "::1", "does not resolve", "metadata"):
        assert written not in addresses.GENERIC_REFUSAL
    assert not WebhookEndpoint.objects.exists()
    # the server's log says what was found
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "10.0.0.5" in logged and "no-such-host.invalid" in logged


def test_a_refused_attempt_stores_the_generic_refusal_only(settings, alice):
    endpoint = WebhookEndpoint.objects.create(project=alice.project, url="", event_types=["message.status"])
    receiver = Receiver(lambda: endpoint.secret)
    try:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url)
        delivery = Delivery.objects.create(endpoint=endpoint, event_type="message.status", source="event:1", payload={"a": 1})
        settings.CALLBACKS_ALLOW_PRIVATE_ADDRESSES = False
        released: list[tuple[str, str]] = []
        deliver.release_due(lambda *args: released.append(args))
        assert deliver.attempt(*released[0]).done == "retry"
        attempt = DeliveryAttempt.objects.get(delivery=delivery)
        assert attempt.error == f"forbidden_address: {addresses.GENERIC_REFUSAL}"
        assert "127.0.0.1" not in attempt.error and attempt.address == ""
    finally:
        receiver.stop()


@pytest.mark.parametrize("url", ["http://10.0.0.5/hook", "http://no-such-host.invalid/hook", "https://8.8.8.8:6379/hook"])
def test_a_sends_callback_url_is_checked_at_accept(guarded, alice, alice_instance, url):
    from messaging import opt_ins

    opt_ins.record(alice.project, RECIPIENT, "signup form")
    response = alice.client().post(
        "/v1/messages/send", {"to": RECIPIENT, "category": "UTILITY", "text": "hi", "callbackUrl": url}, format="json"
    )
    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] in {"forbidden_address", "forbidden_port"}
    assert response.json()["error"]["details"]["url"] == url
    assert not Message.objects.exists()


def test_a_sends_public_callback_url_is_accepted(guarded, alice, alice_instance):
    from messaging import opt_ins

    opt_ins.record(alice.project, RECIPIENT, "signup form")
    response = alice.client().post(
        "/v1/messages/send", {"to": RECIPIENT, "category": "UTILITY", "text": "hi", "callbackUrl": "https://8.8.8.8/hook"},
        format="json",
    )
    assert response.status_code == 202, response.content


@pytest.mark.parametrize("port", [22, 25, 5432, 6379, 8000, 8443])
def test_ports_other_than_80_and_443_are_refused(guarded, port):
    with pytest.raises(addresses.Refused) as refused:
        addresses.check(f"https://8.8.8.8:{port}/hook")
    assert refused.value.code == "forbidden_port"


def test_the_documented_list_adds_ports(guarded, settings):
    settings.CALLBACKS_EXTRA_PORTS = (8443,)
    assert addresses.check("https://8.8.8.8:8443/hook").port == 8443
    assert addresses.check("http://8.8.8.8:80/hook").port == 80
    assert addresses.check("https://8.8.8.8/hook").port == 443
    with pytest.raises(addresses.Refused):
        addresses.check("https://8.8.8.8:8444/hook")


def test_a_port_refusal_at_registration_is_a_422_naming_the_ports(guarded, alice):
    response = create(alice, "https://8.8.8.8:2375/hook")
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "forbidden_port" and error["details"]["allowedPorts"] == [80, 443]


def owed_failed(endpoint_id: str, n: int) -> list[Delivery]:
    return [
        Delivery.objects.create(endpoint_id=endpoint_id, event_type="message.status", source=f"event:{i}",
                                payload={"type": "message.status"}, status="FAILED", attempts=8)
        for i in range(n)
    ]


def test_replays_are_rate_limited_per_endpoint(settings, alice):
    settings.CALLBACKS_REPLAYS_PER_MINUTE = 2
    first = create(alice, "http://127.0.0.1:9/a").json()["id"]
    second = create(alice, "http://127.0.0.1:9/b").json()["id"]
    failed = owed_failed(first, 3)
    client = alice.client()

    assert client.post(f"/v1/webhook-deliveries/{failed[0].pk}/replay").status_code == 200
    assert client.post(f"/v1/webhook-endpoints/{first}/replay-failed", {"since": "2000-01-01T00:00:00Z"},
                       format="json").status_code == 200
    refused = client.post(f"/v1/webhook-deliveries/{failed[1].pk}/replay")
    assert refused.status_code == 429, refused.content
    assert refused.json()["error"]["code"] == "rate_limited" and int(refused["Retry-After"]) >= 1
    again = client.post(f"/v1/webhook-endpoints/{first}/replay-failed", {"since": "2000-01-01T00:00:00Z"}, format="json")
    assert again.status_code == 429
    # another endpoint has its own allowance
    other = owed_failed(second, 1)[0]
    assert client.post(f"/v1/webhook-deliveries/{other.pk}/replay").status_code == 200
