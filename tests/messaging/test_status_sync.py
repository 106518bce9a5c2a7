"""Active status sync (seeds A-D): receipts lost on both channels are recovered by asking
Evolution's findStatusMessage; updates only move forward."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from messaging import status_sync
from messaging.models import Message
from messaging.sending import worker
from tests.messaging.sending_helpers import events, open_on_simulator, send
from tests.support.simulator import wait_until


def statuses_at_evolution(message: Message) -> set[str]:
    from messaging.sending import gateway

    rows = gateway.find_status_messages(message.instance.name, message.evolution_message_id) or []
    return {row.get("status") for row in rows}


def sent_long_ago(simulator, alice, instance, settings, acks: dict) -> Message:
    settings.STATUS_SYNC_AFTER_SECONDS = 60
    open_on_simulator(
        simulator, instance, webhook_drop_rate=1.0, rabbitmq_drop_rate=1.0, ack_delays_ms=acks
    )
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "sent"
    Message.objects.filter(pk=message.pk).update(sent_at=timezone.now() - timedelta(seconds=61))
    return message


def test_a_delivered_message_whose_receipts_were_lost_is_found_delivered(simulator, alice, alice_instance, settings):
    message = sent_long_ago(
        simulator, alice, alice_instance, settings, {"SERVER_ACK": 5, "DELIVERY_ACK": 10, "READ": None}
    )
    message.refresh_from_db()
    wait_until(lambda: "DELIVERY_ACK" in statuses_at_evolution(message), message="Evolution recorded DELIVERY_ACK")
    assert status_sync.run_batch() == 1
    message.refresh_from_db()
    assert message.status == "DELIVERED"
    assert events(message, "STATUS")[-1] == {"status": "DELIVERED", "source": "status_sync"}
    assert status_sync.run_batch() == 0  # no longer a candidate


def test_it_waits_while_evolution_knows_nothing_newer(simulator, alice, alice_instance, settings):
    message = sent_long_ago(
        simulator, alice, alice_instance, settings, {"SERVER_ACK": None, "DELIVERY_ACK": None, "READ": None}
    )
    assert status_sync.run_batch() == 0
    assert Message.objects.get(pk=message.pk).status == "SENT"


def test_a_recent_send_is_not_checked_yet(simulator, alice, alice_instance, settings):
    settings.STATUS_SYNC_AFTER_SECONDS = 60
    open_on_simulator(simulator, alice_instance, webhook_drop_rate=1.0, rabbitmq_drop_rate=1.0)
    message = send(alice)
    worker.send_one(str(message.pk))
    assert status_sync.run_batch() == 0


def test_it_never_moves_a_message_backwards(simulator, alice, alice_instance, settings):
    message = sent_long_ago(
        simulator, alice, alice_instance, settings, {"SERVER_ACK": 5, "DELIVERY_ACK": None, "READ": None}
    )
    Message.objects.filter(pk=message.pk).update(status="DELIVERED")
    message.refresh_from_db()
    wait_until(lambda: "SERVER_ACK" in statuses_at_evolution(message), message="Evolution recorded SERVER_ACK")
    assert not status_sync.sync_one(message)  # Evolution says SERVER_ACK: behind what we know
    assert Message.objects.get(pk=message.pk).status == "DELIVERED"
