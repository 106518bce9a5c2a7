"""An attempt has a hard total deadline however the receiver drips, and one project's attempts in flight are
capped per endpoint and per project (issue 45 §2; docs/security.md "Callback bounds")."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from callbacks import deliver, inflight
from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint
from tests.support.receiver import Receiver
from tests.support.tarpit import Tarpit

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 2.0


@pytest.fixture
def bounded(settings):
    settings.CALLBACKS_ATTEMPT_SECONDS = DEADLINE
    settings.CALLBACKS_TIMEOUT_SECONDS = 10  # each byte comes well within a read's timeout


def endpoint_for(actor, url: str) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(project=actor.project, url=url, event_types=["message.status"])


def owe(endpoint: WebhookEndpoint, n: int = 1) -> list[Delivery]:
    first = Delivery.objects.filter(endpoint=endpoint).count()
    return [
        Delivery.objects.create(endpoint=endpoint, event_type="message.status", source=f"event:{first + i}",
                                payload={"n": first + i}, next_attempt_at=timezone.now() - timedelta(seconds=1))
        for i in range(n)
    ]


def released() -> list[tuple[str, str]]:
    handed: list[tuple[str, str]] = []
    deliver.release_due(lambda *args: handed.append(args))
    return handed


@pytest.mark.parametrize("drip", ["headers", "body"])
def test_a_dripping_receiver_is_a_failed_attempt_at_the_deadline(bounded, alice, drip):
    tarpit = Tarpit(interval=0.2, drip=drip)
    try:
        endpoint = endpoint_for(alice, tarpit.url)
        (delivery,) = owe(endpoint)
        (handed,) = released()
        started = time.monotonic()
        assert deliver.attempt(*handed).done == "retry"
        took = time.monotonic() - started
        assert DEADLINE - 0.1 <= took < DEADLINE + 1.5

        attempt = DeliveryAttempt.objects.get(delivery=delivery)
        assert not attempt.succeeded and "CALLBACKS_ATTEMPT_SECONDS" in attempt.error
        assert DEADLINE * 1000 - 100 <= attempt.duration_ms < (DEADLINE + 1.5) * 1000
        endpoint.refresh_from_db()
        assert endpoint.circuit_failures == 1 and endpoint.failing_since is not None  # the circuit sees it
        assert tarpit.wait_closed(3)  # the connection is closed, not kept for the next attempt
    finally:
        tarpit.stop()


def test_a_prompt_receiver_is_unaffected_by_the_deadline(bounded, alice):
    endpoint = endpoint_for(alice, "")
    receiver = Receiver(lambda: WebhookEndpoint.objects.get(pk=endpoint.pk).secret, keep_alive=True)
    receiver.set("ok")
    try:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url)
        owe(endpoint, 3)
        assert [deliver.attempt(*h).done for h in released()] == ["succeeded"] * 3
        assert len({r.client_port for r in receiver.received}) == 1  # one kept-alive connection still
    finally:
        receiver.stop()


def run_together(handed: list[tuple[str, str]]) -> dict[str, str]:
    """Each handed delivery attempted in a thread of its own, as the worker's threads do."""
    outcomes: dict[str, str] = {}

    def one(args: tuple[str, str]) -> None:
        try:
            outcomes[args[0]] = deliver.attempt(*args).done
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(args,)) for args in handed]
    for thread in threads:
        thread.start()
        time.sleep(0.15)  # in order: the first ones take the slots
    for thread in threads:
        thread.join(30)
    return outcomes


def test_attempts_in_flight_are_capped_per_endpoint_and_per_project(bounded, settings, alice, carol):
    settings.CALLBACKS_INFLIGHT_PER_ENDPOINT = 1
    settings.CALLBACKS_INFLIGHT_PER_PROJECT = 2
    tarpit = Tarpit(interval=0.2)
    prompt = Receiver(lambda: WebhookEndpoint.objects.get(project=carol.project).secret)
    prompt.set("ok")
    try:
        slow_a, slow_b, slow_c = (endpoint_for(alice, f"{tarpit.url}?{i}") for i in range(3))
        carols = endpoint_for(carol, prompt.url)
        first, second = owe(slow_a, 2)
        (on_b,) = owe(slow_b)
        (on_c,) = owe(slow_c)
        (carols_delivery,) = owe(carols)
        handed = {d: h for h in released() for d in [Delivery.objects.get(pk=h[0])]}
        order = [first, second, on_b, on_c, carols_delivery]
        outcomes = run_together([next(h for d, h in handed.items() if d.pk == want.pk) for want in order])

        done = {d.pk: outcomes[str(d.pk)] for d in order}
        # alice: one attempt per endpoint, two for the project; the rest wait without using an attempt
        assert done[first.pk] == "retry" and done[on_b.pk] == "retry"
        assert done[second.pk] == "busy" and done[on_c.pk] == "busy"
        # carol's callback is not held by alice's slow receivers
        assert done[carols_delivery.pk] == "succeeded"
        for held in (second, on_c):
            held.refresh_from_db()
            assert held.attempts == 0 and held.status == "PENDING" and held.claim_token is None
            assert not DeliveryAttempt.objects.filter(delivery=held).exists()
            assert held.next_attempt_at < timezone.now() + timedelta(seconds=1)  # due again in a moment, not at the lease's end
        # every slot was given back
        assert inflight.in_flight(str(slow_a.pk), str(alice.project.pk)) == (0, 0)
    finally:
        tarpit.stop()
        prompt.stop()
