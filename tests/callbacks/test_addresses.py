"""The SSRF guard: URLs that reach our own network are refused at registration and at every attempt."""

from __future__ import annotations

import pytest

from callbacks import addresses, deliver
from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint
from tests.support.receiver import Receiver

REFUSED = [
    "http://127.0.0.1:8000/hook",
    "http://localhost/hook",
    "http://[::1]/hook",
    "http://10.0.0.5/hook",
    "http://192.168.1.10/hook",
    "http://172.16.0.1/hook",
    "http://169.254.169.254/latest/meta-data/",  # the cloud metadata service
    "http://100.100.100.200/",  # Alibaba's metadata service
    "http://[fd00:ec2::254]/",  # AWS's IPv6 metadata service
    "http://100.64.0.1/",  # shared address space (carrier NAT)
    "http://224.0.0.1/",  # multicast
    "http://0.0.0.0/",
    "http://240.0.0.1/",  # reserved
    "http://[::ffff:127.0.0.1]/",  # loopback written as IPv6
    "http://metadata.google.internal/computeMetadata/v1/",
]


@pytest.fixture
def guarded(settings):
    settings.CALLBACKS_ALLOW_PRIVATE_ADDRESSES = False


@pytest.mark.parametrize("url", REFUSED)
def test_addresses_of_our_own_network_are_refused(guarded, url):
    with pytest.raises(addresses.Refused) as refused:
        addresses.check(url)
    assert refused.value.code in {"forbidden_address", "unresolvable_host"}


def test_a_public_address_passes(guarded, settings):
    settings.CALLBACKS_EXTRA_PORTS = (8443,)  # ports beyond 80 and 443 are listed (tests/callbacks/test_guard_edges.py)
    target = addresses.check("https://8.8.8.8:8443/hooks?a=1")
    assert (target.scheme, target.host, target.port, target.path, target.addresses) == (
        "https", "8.8.8.8", 8443, "/hooks?a=1", ("8.8.8.8",)
    )


@pytest.mark.parametrize(
    "url", ["ftp://8.8.8.8/", "http://user:pw@8.8.8.8/", "http:///nohost", "http://8.8.8.8/#frag", "http://8.8.8.8/a b", "8.8.8.8"]
)
def test_urls_that_are_not_plain_http_are_refused(url):
    with pytest.raises(addresses.Refused) as refused:
        addresses.check(url)
    assert refused.value.code == "invalid_url"


def test_an_endpoint_on_127_0_0_1_is_refused_when_private_addresses_are_not_allowed(guarded, alice):
    response = alice.client().post(
        "/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/hook", "eventTypes": ["message.status"]}, format="json"
    )
    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] == "forbidden_address"
    assert not WebhookEndpoint.objects.exists()


def test_the_same_endpoint_is_accepted_when_private_addresses_are_allowed(settings, alice):
    settings.CALLBACKS_ALLOW_PRIVATE_ADDRESSES = True
    response = alice.client().post(
        "/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/hook", "eventTypes": ["message.status"]}, format="json"
    )
    assert response.status_code == 201, response.content


def test_an_address_is_checked_again_at_every_attempt(settings, alice):
    # given: an endpoint registered while loopback was allowed (as if its DNS pointed elsewhere then)
    endpoint = WebhookEndpoint.objects.create(project=alice.project, url="", event_types=["message.status"])
    receiver = Receiver(lambda: endpoint.secret)
    receiver.set("ok")
    try:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url)
        delivery = Delivery.objects.create(endpoint=endpoint, event_type="message.status", source="event:1", payload={"a": 1})
        settings.CALLBACKS_ALLOW_PRIVATE_ADDRESSES = False

        # when: the attempt comes
        released: list[tuple[str, str]] = []
        deliver.release_due(lambda *args: released.append(args))
        assert deliver.attempt(*released[0]).done == "retry"

        # then: nothing was posted, and the attempt says why
        assert receiver.received == []
        attempt = DeliveryAttempt.objects.get(delivery=delivery)
        assert attempt.response_status is None and attempt.error == f"forbidden_address: {addresses.GENERIC_REFUSAL}"
    finally:
        receiver.stop()
