"""The outbox promise (docs/architecture.md, principle 1): with Redis and RabbitMQ really stopped, valid sends still get
202, and every one of them is delivered once both come back."""

from __future__ import annotations

import pytest
import requests

from messaging import opt_ins
from messaging.models import Message, OutboxEntry
from tests.support.services import stopped
from tests.support.simulator import wait_until

COUNT = 20


@pytest.mark.serial
def test_sends_are_accepted_with_redis_and_rabbitmq_down_and_delivered_after(stack, simulator, alice, alice_instance):
    simulator.register(alice_instance, stack.webhook_url)
    recipients = [f"+55119888{n:05d}" for n in range(COUNT)]
    for phone in recipients:
        opt_ins.record(alice.project, phone, "form")
    headers = {"Authorization": f"Bearer {alice.live_key}"}

    with stopped("redis", "rabbitmq"):
        answers = [
            requests.post(
                f"{stack.web_url}/v1/messages/send",
                json={"to": phone, "category": "UTILITY", "text": "Invoice ready"},
                headers=headers,
                timeout=15,
            )
            for phone in recipients
        ]
        assert [a.status_code for a in answers] == [202] * COUNT, [a.text for a in answers if a.status_code != 202]
        # nothing could be released: the work waits in Postgres
        assert OutboxEntry.objects.count() + Message.objects.filter(status="QUEUED").count() >= COUNT

    ids = {a.json()["id"] for a in answers}
    wait_until(
        lambda: Message.objects.filter(pk__in=ids, status__in=["DELIVERED", "READ"]).count() == COUNT,
        timeout=120,
        interval=0.5,
        message="every message delivered after Redis and RabbitMQ came back",
    )
    sends = simulator.sends(instance=alice_instance.name)
    assert len({s["number"] for s in sends if s["status"] == 201}) == COUNT
