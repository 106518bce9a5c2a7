"""One message travels the whole way on real parts: API → outbox → relay → lane worker →
simulator → webhooks → inbox → SERVER_ACK, DELIVERED, READ."""

from __future__ import annotations

import requests

from messaging.models import Message
from tests.support.simulator import wait_until


def test_a_message_reaches_read_end_to_end(stack, simulator, alice, alice_instance):
    # given: alice's instance is live on the simulator, with its webhook pointed at our web
    simulator.register(alice_instance, stack.webhook_url)
    worker_log = stack.processes["worker-utility"].log
    logged_before = worker_log.stat().st_size
    from messaging import opt_ins

    opt_ins.record(alice.project, "+5511988887777", "signup form")

    # when: a client sends through the real web server
    response = requests.post(
        f"{stack.web_url}/v1/messages/send",
        json={"to": "+5511988887777", "category": "UTILITY", "text": "Order {{n}} shipped", "variables": {"n": "42"}},
        headers={"Authorization": f"Bearer {alice.live_key}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    message_id = response.json()["id"]

    # then: it is sent once, with the rendered text, and reaches READ through the webhooks
    message = wait_until(
        lambda: Message.objects.filter(pk=message_id, status="READ").first(), timeout=20, message="READ"
    )
    sends = simulator.sends(instance=alice_instance.name)
    assert [s["text"] for s in sends] == ["Order 42 shipped"]
    assert message.evolution_message_id == sends[0]["id"]
    assert message.attempts == 1

    detail = requests.get(
        f"{stack.web_url}/v1/messages/{message_id}", headers={"Authorization": f"Bearer {alice.live_key}"}, timeout=10
    ).json()
    assert detail["status"] == "READ"
    statuses = [e["detail"].get("status") for e in detail["events"] if e["type"] == "STATUS"]
    # Receipts race each other over two channels; forward-only means a late SERVER_ACK is
    # dropped, so the timeline is an ordered subsequence that starts at SENT and ends at READ.
    order = ["SENT", "SERVER_ACK", "DELIVERED", "READ"]
    assert statuses[0] == "SENT" and statuses[-1] == "READ"
    assert statuses == sorted(statuses, key=order.index)
    kinds = [e["type"] for e in detail["events"]]
    assert kinds[:3] == ["ACCEPTED", "DISPATCHED", "ATTEMPT"]
    # and the lane worker did not log Celery's line per task received and per task done (the timeline says it):
    # at a lane's 100 sends a second that was 200 lines a second (settings.LOGGING, CELERY_TASK_LOG_LEVEL)
    with worker_log.open("rb") as log:
        log.seek(logged_before)
        assert b"messaging.send_message[" not in log.read()
