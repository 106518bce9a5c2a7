"""Status callbacks on the real stack (issue 23): web, relay, lane workers, the simulator's webhooks,
beat and the callbacks worker, and a real HTTP receiver that checks every signature. The receiver is
down for a while, then answers 500, then comes back: every callback arrives, each message's last
one is its final status, and every attempt is recorded."""

from __future__ import annotations

import time
from datetime import timedelta

import requests
from django.utils import timezone

from callbacks import deliver
from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint
from messaging import opt_ins
from messaging.models import EventKind, Message, MessageEvent
from tests.support.receiver import Receiver
from tests.support.simulator import wait_until

RECIPIENTS = ["+5511988887771", "+5511988887772", "+5511988887773"]
FAST = {
    "CALLBACKS_RELAY_SECONDS": "1",
    # twenty quick steps instead of Svix's 27 hours; the circuit opens after 3 failures for 1 s
    "CALLBACKS_RETRY_SCHEDULE": ",".join(["0", "1"] + ["2"] * 18),
    "CALLBACKS_CIRCUIT_FAILURES": "3",
    "CALLBACKS_CIRCUIT_OPEN_SECONDS": "1",
    # beat's other entries go to queues no worker serves here: keep them rare
    "RECONCILE_SECONDS": "3600",
    "STATUS_SYNC_SECONDS": "3600",
    "INSTANCE_POLL_SECONDS": "3600",
    "INGESTION_RECONCILE_SECONDS": "3600",
    "RETENTION_SECONDS": "3600",
}


def test_every_status_callback_arrives_signed_through_an_outage_and_500s(stack, simulator, alice, alice_instance):
    simulator.register(alice_instance, stack.webhook_url)
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {alice.live_key}"
    secret: dict[str, str] = {}
    receiver = Receiver(lambda: secret["value"])
    try:
        # given: an endpoint registered through the API, whose receiver is down
        created = api.post(
            f"{stack.web_url}/v1/webhook-endpoints",
            json={"url": receiver.url, "eventTypes": ["message.status"]},
            timeout=10,
        )
        assert created.status_code == 201, created.text
        secret["value"] = created.json()["secret"]
        endpoint_id = created.json()["id"]
        stack.start_callbacks(FAST)

        # when: three messages go all the way to READ while the receiver is down, then answers 500
        ids = []
        for to in RECIPIENTS:
            opt_ins.record(alice.project, to, "signup form")
            response = api.post(
                f"{stack.web_url}/v1/messages/send", json={"to": to, "category": "UTILITY", "text": "Order shipped"}, timeout=10
            )
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
        wait_until(lambda: Message.objects.filter(pk__in=ids, status="READ").count() == 3, timeout=30, message="READ")
        wait_until(lambda: DeliveryAttempt.objects.filter(response_status=None).exists(), timeout=20, message="a refused attempt")
        time.sleep(2)
        receiver.set("error")
        wait_until(lambda: DeliveryAttempt.objects.filter(response_status=500).exists(), timeout=20, message="a 500 attempt")
        time.sleep(2)
        # then it comes back
        receiver.set("ok")

        # then: every status line of the three messages arrives once, signed
        lines = MessageEvent.objects.filter(message_id__in=ids, kind__in=[EventKind.STATUS, EventKind.FAILED])
        expected = {line.pk for line in lines}
        assert len(expected) >= 3 * 2  # at least SENT and READ each
        wait_until(
            lambda: {r.payload["data"]["sequence"] for r in receiver.accepted()} >= expected,
            timeout=60, message="every callback",
        )
        accepted = receiver.accepted()
        assert all(r.verified for r in accepted)
        assert {r.payload["data"]["sequence"] for r in accepted} == expected
        # a copy may come twice only with the same webhook-id (never here: each was answered once with 2xx)
        assert len({r.headers["webhook-id"] for r in accepted}) == len(accepted) == len(expected)
        for message_id in ids:
            mine = [r.payload["data"] for r in accepted if r.payload["data"]["messageId"] == message_id]
            assert max(mine, key=lambda data: data["sequence"])["status"] == "READ"

        # and: every delivery succeeded, and the attempts show the outage, the 500s and the success
        wait_until(lambda: not Delivery.objects.exclude(status="SUCCEEDED").exists(), timeout=10, message="all SUCCEEDED")
        attempts = list(DeliveryAttempt.objects.all())
        assert any(a.response_status is None and "NewConnectionError" in a.error for a in attempts)
        assert any(a.response_status == 500 for a in attempts)
        assert sum(a.succeeded for a in attempts) == len(expected)
        # which the API shows per delivery
        page = api.get(f"{stack.web_url}/v1/webhook-endpoints/{endpoint_id}/deliveries?limit=100", timeout=10).json()
        assert len(page["data"]) == len(expected)
        assert all(d["status"] == "SUCCEEDED" and d["attemptLog"][0]["succeeded"] for d in page["data"])
        assert any(len(d["attemptLog"]) > 1 for d in page["data"])
    finally:
        receiver.stop()
        stack.stop_callbacks()


def test_the_relay_pass_goes_on_while_a_released_batch_drains(stack, alice):
    """The pass hands out at most RELEASE_BATCH deliveries a tick. It must not wait behind them: on the
    deliveries' own FIFO queue each tick expired behind the batch, so nothing new was written or handed
    out until the whole batch drained (chaos/findings.md 12)."""
    endpoint = WebhookEndpoint.objects.create(project=alice.project, url="", event_types=["message.status"])
    # a slow receiver: 8 threads at 0.2 s an answer take about 12 s for a whole batch
    receiver = Receiver(lambda: endpoint.secret, delay=0.2)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url)
    receiver.set("ok")
    due = timezone.now() - timedelta(seconds=1)
    Delivery.objects.bulk_create(
        Delivery(endpoint=endpoint, event_type="message.status", source=f"event:{i}",
                 payload={"type": "message.status", "data": {"sequence": i}}, next_attempt_at=due)
        for i in range(deliver.RELEASE_BATCH)
    )
    try:
        stack.start_callbacks(FAST)
        # when: a pass has handed the whole batch out, and then one more delivery falls due
        wait_until(lambda: not Delivery.objects.filter(claim_token=None).exists(), timeout=30, message="the batch handed out")
        late = Delivery.objects.create(endpoint=endpoint, event_type="message.status", source="event:late",
                                       payload={"type": "message.status", "data": {"sequence": -1}})

        # then: a later pass hands it out while most of the batch still waits for its turn
        wait_until(lambda: Delivery.objects.filter(pk=late.pk, claim_token__isnull=False).exists(), timeout=60,
                   message="the late delivery handed out")
        answered = len(receiver.received)
        assert answered < deliver.RELEASE_BATCH // 2, f"{answered} of the batch were answered before the next pass ran"
        # and: every delivery arrives, once
        wait_until(lambda: not Delivery.objects.exclude(status="SUCCEEDED").exists(), timeout=120, message="all SUCCEEDED")
        assert len({r.headers["webhook-id"] for r in receiver.accepted()}) == deliver.RELEASE_BATCH + 1
    finally:
        receiver.stop()
        stack.stop_callbacks()
