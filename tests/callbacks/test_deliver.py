"""One attempt at a time against a real HTTP receiver: signed, retried on the schedule, a circuit per
endpoint, disabled after a long failing run, every attempt logged."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks import deliver
from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint
from tests.support.receiver import Receiver

# The receiver runs in a thread with its own connection: it reads the committed secret.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def endpoint(alice):
    return WebhookEndpoint.objects.create(project=alice.project, url="", event_types=["message.status"])


@pytest.fixture
def receiver(endpoint):
    receiver = Receiver(lambda: WebhookEndpoint.objects.get(pk=endpoint.pk).secret, answer_body=b"x" * 5000)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url)
    yield receiver
    receiver.stop()


def owe(endpoint: WebhookEndpoint, n: int = 1, first: int = 0) -> list[Delivery]:
    return [
        Delivery.objects.create(
            endpoint=endpoint, event_type="message.status", source=f"event:{i}",
            payload={"type": "message.status", "data": {"sequence": i}},
            next_attempt_at=timezone.now() - timedelta(seconds=1),
        )
        for i in range(first, first + n)
    ]


def run_due() -> list[str]:
    released: list[tuple[str, str]] = []
    deliver.release_due(lambda *args: released.append(args))
    return [deliver.attempt(*args).done for args in released]


def test_a_delivery_arrives_signed_and_its_attempt_is_logged(endpoint, receiver):
    receiver.set("ok")
    (delivery,) = owe(endpoint)
    assert run_due() == ["succeeded"]

    (got,) = receiver.received
    assert got.verified and got.payload == delivery.payload
    assert got.headers["webhook-id"] == delivery.webhook_id
    assert got.headers["content-type"] == "application/json"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("SUCCEEDED", 1) and delivery.delivered_at
    attempt = DeliveryAttempt.objects.get(delivery=delivery)
    assert attempt.succeeded and attempt.response_status == 204 and attempt.address == "127.0.0.1"
    assert attempt.request_headers["webhook-signature"].startswith("v1,")
    # nothing is due any more, and a duplicate task finds nothing to claim
    assert run_due() == []
    from pilot_status import metrics

    assert metrics.read_all().get("ps:metrics:callbacks:succeeded") == 1


def test_a_failure_waits_for_the_next_step_of_the_schedule_and_keeps_only_1_kb_of_the_answer(settings, endpoint, receiver):
    settings.CALLBACKS_RETRY_SCHEDULE = [0, 5, 300]
    receiver.set("error")
    (delivery,) = owe(endpoint)
    before = timezone.now()
    assert run_due() == ["retry"]
    delivery.refresh_from_db()
    assert delivery.status == "PENDING" and delivery.attempts == 1
    assert before + timedelta(seconds=4.5) <= delivery.next_attempt_at <= timezone.now() + timedelta(seconds=5.5)
    attempt = DeliveryAttempt.objects.get(delivery=delivery)
    assert attempt.response_status == 500 and len(attempt.response_body) == 1024 and not attempt.succeeded

    # the last step fails too: the delivery is FAILED (replayable), with one logged attempt per try
    for _ in range(2):
        Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(circuit_state="closed", circuit_retry_at=None)
        run_due()
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("FAILED", 3)
    assert DeliveryAttempt.objects.filter(delivery=delivery).count() == 3


def test_a_receiver_that_is_down_is_an_attempt_with_an_error(endpoint, receiver):
    (delivery,) = owe(endpoint)
    assert run_due() == ["retry"]
    attempt = DeliveryAttempt.objects.get(delivery=delivery)
    assert attempt.response_status is None and "NewConnectionError" in attempt.error


def test_the_circuit_opens_after_a_run_of_failures_and_one_probe_closes_it(settings, endpoint, receiver):
    settings.CALLBACKS_CIRCUIT_FAILURES = 3
    settings.CALLBACKS_CIRCUIT_OPEN_SECONDS = 60
    settings.CALLBACKS_RETRY_SCHEDULE = [0, 0, 0, 0, 0, 0]
    owe(endpoint, 10)
    outcomes = run_due()
    # three attempts fail, then the circuit holds the rest without using their attempts
    assert outcomes.count("retry") == 3 and outcomes.count("held") == 7
    endpoint.refresh_from_db()
    assert endpoint.circuit_state == "open" and endpoint.failing_since
    assert run_due() == []  # nothing is released while it is open
    assert DeliveryAttempt.objects.count() == 3

    # when the wait is over one probe goes; it succeeds, the circuit closes, and everything arrives
    receiver.set("ok")
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(circuit_retry_at=timezone.now())
    Delivery.objects.update(next_attempt_at=timezone.now())
    for _ in range(3):
        run_due()
    endpoint.refresh_from_db()
    assert endpoint.circuit_state == "closed" and endpoint.failing_since is None
    assert Delivery.objects.filter(status="SUCCEEDED").count() == 10
    assert len({r.headers["webhook-id"] for r in receiver.accepted()}) == 10


def test_an_endpoint_failing_for_the_whole_period_is_disabled_and_says_so(settings, endpoint, receiver):
    settings.CALLBACKS_DISABLE_AFTER_SECONDS = 3600
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=timezone.now() - timedelta(hours=2))
    owe(endpoint, 2)
    assert run_due() == ["retry", "endpoint_disabled"]
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_at and "failed since" in endpoint.disabled_reason
    Delivery.objects.update(next_attempt_at=timezone.now())
    assert run_due() == []  # a disabled endpoint gets nothing


def test_a_rotated_secret_signs_the_next_attempt(alice, endpoint, receiver):
    receiver.set("ok")
    old = endpoint.secret
    response = alice.client().post(f"/v1/webhook-endpoints/{endpoint.pk}/rotate-secret", format="json")
    assert response.status_code == 200 and response.json()["secret"] not in (old, None)
    owe(endpoint)
    assert run_due() == ["succeeded"]
    assert receiver.received[0].verified  # the receiver checks with the current secret


def test_a_delivery_with_its_own_url_goes_there_signed_with_its_endpoints_secret(alice, receiver):
    own = WebhookEndpoint.objects.create(project=alice.project, url="", per_message=True, event_types=["message.status"])
    mine = Receiver(lambda: own.secret)
    mine.set("ok")
    try:
        Delivery.objects.create(
            endpoint=own, event_type="message.status", source="event:9", url=mine.url, payload={"a": 1},
            next_attempt_at=timezone.now() - timedelta(seconds=1),
        )
        assert run_due() == ["succeeded"]
        (got,) = mine.received
        assert got.verified and got.payload == {"a": 1}
        assert DeliveryAttempt.objects.get().url == mine.url
    finally:
        mine.stop()


def test_an_endpoint_deleted_while_its_delivery_was_handed_out_ends_quietly(endpoint, receiver):
    receiver.set("ok")
    owe(endpoint)
    released: list[tuple[str, str]] = []
    deliver.release_due(lambda *args: released.append(args))
    endpoint.delete()
    assert [deliver.attempt(*args).done for args in released] == ["claimed_elsewhere"]
    assert receiver.received == []


def endpoint_row_version(endpoint: WebhookEndpoint) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM callbacks_webhookendpoint WHERE id = %s", [endpoint.pk])
        return cursor.fetchone()[0]


def test_a_success_on_a_closed_circuit_leaves_the_endpoint_row_alone_and_one_after_a_failure_resets_it(
    settings, endpoint, receiver
):
    """The endpoint's row is locked and written only when its circuit changes: written on every delivery,
    it made each delivery wait for the one before it to commit, and the deliveries being written for the
    endpoint wait at their foreign key check (bench B3's callbacks: 3.5 ms per lock under load)."""
    settings.CALLBACKS_RETRY_SCHEDULE = [0, 0, 0]
    receiver.set("ok")
    owe(endpoint, 2)
    assert run_due() == ["succeeded", "succeeded"]
    version = endpoint_row_version(endpoint)
    owe(endpoint, 3, first=2)
    assert run_due() == ["succeeded"] * 3
    assert endpoint_row_version(endpoint) == version

    receiver.set("error")
    owe(endpoint, first=5)
    assert run_due() == ["retry"]
    endpoint.refresh_from_db()
    assert (endpoint.circuit_state, endpoint.circuit_failures) == ("closed", 1) and endpoint.failing_since
    receiver.set("ok")
    Delivery.objects.filter(status="PENDING").update(next_attempt_at=timezone.now())
    assert run_due() == ["succeeded"]
    endpoint.refresh_from_db()
    assert (endpoint.circuit_state, endpoint.circuit_failures, endpoint.failing_since) == ("closed", 0, None)


def test_deliveries_to_one_receiver_share_a_kept_alive_connection_unless_an_answer_is_left_unread(endpoint):
    """A connection per delivery cost a handshake each time and left a socket in TIME_WAIT on our side for a
    minute: a few hundred callbacks a second to one receiver would use up the ephemeral ports."""
    from callbacks import http

    secret = WebhookEndpoint.objects.get(pk=endpoint.pk).secret
    receiver = Receiver(lambda: secret, keep_alive=True)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url)
    http._manager = None  # no connection kept from another test's receiver on a reused port
    try:
        receiver.set("ok")
        owe(endpoint, 3)
        assert run_due() == ["succeeded"] * 3
        assert len({r.client_port for r in receiver.received}) == 1

        # An answer longer than the 1 KB we keep is not read to its end: its connection is closed, and the next
        # delivery opens another one and arrives whole.
        receiver.set("error")
        receiver.answer_body = b"x" * 5000
        owe(endpoint, first=3)
        assert run_due() == ["retry"]
        receiver.set("ok")
        Delivery.objects.filter(status="PENDING").update(next_attempt_at=timezone.now())
        assert run_due() == ["succeeded"]
        assert [r.answered for r in receiver.received[-2:]] == [500, 204]
        assert receiver.received[-1].client_port != receiver.received[-2].client_port
    finally:
        receiver.stop()
