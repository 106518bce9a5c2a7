"""Active status sync: receipts lost on both channels are recovered by asking
Evolution's findStatusMessage; updates only move forward."""

from __future__ import annotations

import uuid
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


# ---- issue 22: every pass advances -----------------------------------------------------------

def never_acknowledged(template: Message, count: int, sent_ago: timedelta) -> list[Message]:
    """`count` copies of a sent message to phones that never acknowledge: Evolution has no status
    row for them (ids it never recorded), so every check answers "nothing newer"."""
    base = timezone.now() - sent_ago
    copies = []
    for i in range(count):
        copy = Message.objects.get(pk=template.pk)
        copy.pk = None
        copy.id = uuid.uuid4()
        copy.status = "SENT"
        copy.evolution_message_id = copy.own_message_id = f"3EB0NEVERACK{i:010d}"  # ids are one message's
        copy.sent_at = base - timedelta(seconds=count - i)  # older than the lost receipt below
        copies.append(copy)
    return Message.objects.bulk_create(copies)


def test_stale_messages_that_never_acknowledge_do_not_starve_a_newer_lost_receipt(
    simulator, alice, alice_instance, settings
):
    settings.STATUS_SYNC_AFTER_SECONDS = 60
    lost = sent_long_ago(simulator, alice, alice_instance, settings, {"SERVER_ACK": 5, "DELIVERY_ACK": 10, "READ": None})
    lost.refresh_from_db()
    wait_until(lambda: "DELIVERY_ACK" in statuses_at_evolution(lost), message="Evolution recorded DELIVERY_ACK")
    never_acknowledged(lost, 250, sent_ago=timedelta(minutes=10))
    for _ in range(3):
        status_sync.run_batch()
        if Message.objects.get(pk=lost.pk).status == "DELIVERED":
            break
    assert Message.objects.get(pk=lost.pk).status == "DELIVERED"
    # Every stale message was asked about once, none twice: a checked one waits its turn again.
    assert Message.objects.filter(status="SENT", status_checked_at__isnull=True).count() == 0


def test_a_pass_takes_the_least_recently_checked_first(simulator, alice, alice_instance, settings):
    message = sent_long_ago(simulator, alice, alice_instance, settings, {"SERVER_ACK": None, "DELIVERY_ACK": None, "READ": None})
    older, newer = never_acknowledged(message, 2, sent_ago=timedelta(minutes=10))
    now = timezone.now()
    Message.objects.filter(pk=message.pk).update(status_checked_at=now - timedelta(minutes=5))
    Message.objects.filter(pk=older.pk).update(status_checked_at=now - timedelta(minutes=2))
    Message.objects.filter(pk=newer.pk).update(status_checked_at=now - timedelta(seconds=30))  # too recent
    assert [m.pk for m in status_sync.candidates(timezone.now(), 10)] == [message.pk, older.pk]


def test_it_gives_up_after_the_horizon_with_one_timeline_line(simulator, alice, alice_instance, settings):
    settings.STATUS_SYNC_GIVE_UP_AFTER_HOURS = 72
    message = sent_long_ago(simulator, alice, alice_instance, settings, {"SERVER_ACK": None, "DELIVERY_ACK": None, "READ": None})
    Message.objects.filter(pk=message.pk).update(sent_at=timezone.now() - timedelta(hours=73))
    assert status_sync.run_batch() == 0
    message.refresh_from_db()
    assert message.status == "SENT"  # keeps its status
    assert message.status_sync_stopped_at is not None
    assert len(events(message, "SYNC_STOPPED")) == 1
    Message.objects.filter(pk=message.pk).update(status_checked_at=timezone.now() - timedelta(days=1))
    assert status_sync.candidates(timezone.now(), 10) == []
    status_sync.run_batch()
    assert len(events(message, "SYNC_STOPPED")) == 1


def test_a_message_evolution_cannot_answer_for_does_not_hold_the_line(simulator, alice, alice_instance, settings):
    message = sent_long_ago(simulator, alice, alice_instance, settings, {"SERVER_ACK": None, "DELIVERY_ACK": None, "READ": None})
    Message.objects.filter(pk=message.pk).update(sent_at=timezone.now() - timedelta(hours=1))
    simulator.instance(alice_instance.name, deleted=True)  # every lookup answers 404: cannot tell
    status_sync.run_batch()
    message.refresh_from_db()
    assert message.status_checked_at is not None  # stamped: the next pass starts past it
    assert status_sync.candidates(timezone.now(), 10) == []


def test_a_pass_stops_at_its_time_budget(simulator, alice, alice_instance, settings):
    message = sent_long_ago(simulator, alice, alice_instance, settings, {"SERVER_ACK": None, "DELIVERY_ACK": None, "READ": None})
    never_acknowledged(message, 20, sent_ago=timedelta(minutes=10))
    status_sync.run_batch(budget_s=0)
    assert Message.objects.filter(status_checked_at__isnull=False).count() == 1
