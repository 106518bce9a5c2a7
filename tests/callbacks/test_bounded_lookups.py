"""Host lookups for callbacks are bounded (issue 45 §3; docs/security.md "Callback bounds"): a name server
that never answers costs a request CALLBACKS_RESOLVE_SECONDS at most, a project whose lookup overran is
refused at once until it ends, other projects look up as usual, and the endpoint count is checked first.

The name server is the system's resolver (getaddrinfo): here a stand-in holds `*.tarpit.test` until the
test ends, answers `*.fast.test` with a public address and passes every other name to the real one. chaos
S8 runs the same against a real name server that never answers (docs/reliability.md)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from callbacks import addresses, deliver
from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint
from messaging import opt_ins
from messaging.models import Message
from tests.messaging.sending_helpers import RECIPIENT

DEADLINE = 1.0  # long enough that a loaded host answers a refused-at-once request well within it


class NameServer:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.asked: list[str] = []
        self.real = socket.getaddrinfo

    def __call__(self, host, port, *args, **kwargs):
        name = str(host)
        if name.endswith(".tarpit.test"):
            self.asked.append(name)
            self.release.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if name.endswith(".fast.test"):
            self.asked.append(name)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.8.8", port))]
        return self.real(host, port, *args, **kwargs)


@pytest.fixture
def name_server(monkeypatch, settings):
    settings.CALLBACKS_ALLOW_PRIVATE_ADDRESSES = False
    settings.CALLBACKS_RESOLVE_SECONDS = DEADLINE
    server = NameServer()
    monkeypatch.setattr(socket, "getaddrinfo", server)
    yield server
    server.release.set()
    addresses.wait_for_lookups(5)  # the held lookups end before the next test counts its own


def create(actor, url: str):
    return actor.client().post("/v1/webhook-endpoints", {"url": url, "eventTypes": ["message.status"]}, format="json")


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_a_lookup_that_never_answers_ends_at_the_deadline_with_the_generic_refusal(name_server):
    started = time.monotonic()
    with pytest.raises(addresses.Refused) as refused:
        addresses.check("https://hooks.tarpit.test/a", owner="p1")
    assert DEADLINE <= time.monotonic() - started < DEADLINE + 1.0
    assert refused.value.code == "forbidden_address" and refused.value.message == addresses.GENERIC_REFUSAL
    assert name_server.asked == ["hooks.tarpit.test"]


def test_registration_answers_within_the_deadline_and_then_refuses_that_project_at_once(name_server, alice, carol):
    first, took = timed(lambda: create(alice, "https://one.tarpit.test/hook"))
    assert first.status_code == 422 and first.json()["error"]["code"] == "forbidden_address"
    assert DEADLINE <= took < DEADLINE + 1.0

    # alice's lookup still hangs: her next one is refused without asking the name server again
    second, took = timed(lambda: create(alice, "https://two.tarpit.test/hook"))
    assert second.status_code == 422 and took < DEADLINE
    assert name_server.asked == ["one.tarpit.test"]

    # carol's lookups go on as usual
    other, took = timed(lambda: create(carol, "https://hooks.fast.test/hook"))
    assert other.status_code == 201, other.content
    assert took < DEADLINE
    assert WebhookEndpoint.objects.filter(project=carol.project).count() == 1
    assert not WebhookEndpoint.objects.filter(project=alice.project).exists()


def test_the_endpoint_count_is_checked_before_the_host_is_looked_up(name_server, settings, alice):
    settings.CALLBACKS_MAX_ENDPOINTS_PER_PROJECT = 1
    assert create(alice, "https://8.8.8.8/hook").status_code == 201
    full, took = timed(lambda: create(alice, "https://hooks.tarpit.test/hook"))
    assert full.status_code == 409 and full.json()["error"]["code"] == "too_many_endpoints"
    assert name_server.asked == [] and took < DEADLINE


def test_a_sends_callback_url_lookup_is_bounded_too(name_server, alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "signup form")
    response, took = timed(lambda: alice.client().post(
        "/v1/messages/send",
        {"to": RECIPIENT, "category": "UTILITY", "text": "hi", "callbackUrl": "https://hooks.tarpit.test/x"}, format="json",
    ))
    assert response.status_code == 422 and took < DEADLINE + 1.0
    assert not Message.objects.exists()


def test_an_attempt_whose_lookup_never_answers_is_a_failed_attempt_within_the_deadline(name_server, alice):
    endpoint = WebhookEndpoint.objects.create(project=alice.project, url="https://hooks.tarpit.test/h",
                                              event_types=["message.status"])
    delivery = Delivery.objects.create(endpoint=endpoint, event_type="message.status", source="event:1", payload={"a": 1})
    released: list[tuple[str, str]] = []
    deliver.release_due(lambda *args: released.append(args))
    outcome, took = timed(lambda: deliver.attempt(*released[0]).done)
    assert outcome == "retry" and took < DEADLINE + 1.0
    attempt = DeliveryAttempt.objects.get(delivery=delivery)
    assert not attempt.succeeded and attempt.error == f"forbidden_address: {addresses.GENERIC_REFUSAL}"
