"""The sticky sender (docs/sending-policy.md): the project's number that last exchanged with a recipient sends to
them; a cold contact goes through a number with cold contacts left, or waits, or fails NO_WARM_INSTANCE."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ingestion import handlers, inbox
from messaging import exchanges
from messaging.models import Contact, DeadLetter, Instance, Message, SendSchedule
from messaging.sending import worker
from tests.conftest import add_instance
from tests.ingestion.test_inbound_opt_out import inbound
from tests.messaging import sending_helpers
from tests.messaging.sending_helpers import events, open_on_simulator, queue, sends_ok

RECIPIENT = "+5511977776666"


@pytest.fixture
def numbers(alice):
    return (add_instance(alice.project, "alice-a", priority=10, profile="unofficial"),
            add_instance(alice.project, "alice-b", priority=20, profile="unofficial"))


def out_of_cold_contacts(instance) -> None:
    now = timezone.now()
    SendSchedule.objects.create(instance=instance, first_send_at=now, hour_started_at=now, hour_sent=10,
                                day_started_at=now, day_sent=10, day_cold=10)


def test_the_number_that_last_talked_with_the_recipient_sends(simulator, alice, numbers):
    first, second = numbers
    open_on_simulator(simulator, first, second)
    sending_helpers.exchanged(first.pk, RECIPIENT, timezone.now() - timedelta(days=3))
    exchanges.received(second.name, RECIPIENT, timezone.now() - timedelta(hours=1))
    [message_id] = queue(alice, "UTILITY", 1, to=RECIPIENT)
    assert Message.objects.get(pk=message_id).instance == first  # the funnel's choice: the best by priority
    assert worker.send_one(message_id) == "sent"
    message = Message.objects.get(pk=message_id)
    assert message.instance == second
    assert events(message, "REROUTED") == [{"from": "alice-a", "to": "alice-b", "why": "sticky sender"}]
    assert len(sends_ok(simulator, "alice-b")) == 1 and sends_ok(simulator, "alice-a") == []


def test_a_number_that_knows_the_recipient_keeps_them(simulator, alice, numbers):
    first, second = numbers
    open_on_simulator(simulator, first, second)
    sending_helpers.exchanged(first.pk, RECIPIENT, timezone.now())
    [message_id] = queue(alice, "UTILITY", 1, to=RECIPIENT)
    assert worker.send_one(message_id) == "sent"
    assert Message.objects.get(pk=message_id).instance == first


def test_a_cold_contact_goes_through_a_number_with_cold_contacts_left(simulator, alice, numbers):
    first, second = numbers
    open_on_simulator(simulator, first, second)
    out_of_cold_contacts(first)
    [message_id] = queue(alice, "UTILITY", 1, to=RECIPIENT)
    assert worker.send_one(message_id) == "sent"
    message = Message.objects.get(pk=message_id)
    assert message.instance == second and events(message, "REROUTED")[0]["why"] == "no cold contacts left on its number"
    assert Contact.objects.filter(instance=second, phone=RECIPIENT, last_direction="outbound").exists()


def test_no_number_may_reach_a_cold_contact_in_time_fails_no_warm_instance(simulator, alice, numbers):
    for number in numbers:
        out_of_cold_contacts(number)
    open_on_simulator(simulator, *numbers)
    [message_id] = queue(alice, "UTILITY", 1, to=RECIPIENT)
    assert worker.send_one(message_id) == "failed"
    message = Message.objects.get(pk=message_id)
    assert (message.status, message.failure_reason) == ("FAILED", "NO_WARM_INSTANCE")
    assert DeadLetter.objects.get(message=message).reason == "NO_WARM_INSTANCE"
    assert sends_ok(simulator, "alice-a") == sends_ok(simulator, "alice-b") == []


def test_a_cold_contact_with_time_left_waits_for_its_numbers_next_day(simulator, alice, numbers):
    for number in numbers:
        out_of_cold_contacts(number)
    open_on_simulator(simulator, *numbers)
    [message_id] = queue(alice, "MARKETING", 1, to=RECIPIENT)
    Message.objects.filter(pk=message_id).update(deliver_until=timezone.now() + timedelta(days=2))
    assert worker.send_one(message_id) == "held"
    message = Message.objects.get(pk=message_id)
    assert message.status == "QUEUED" and message.hold_reason.startswith("warming_up|alice-a")


def test_a_named_instance_is_never_moved(simulator, alice, numbers):
    first, second = numbers
    open_on_simulator(simulator, first, second)
    exchanges.received(second.name, RECIPIENT, timezone.now())
    from messaging import opt_ins
    from messaging.accept import SendRequest, accept_message

    opt_ins.record(alice.project, RECIPIENT, "form")
    accepted = accept_message(alice.project, None, "LIVE", SendRequest(RECIPIENT, "UTILITY", "hi", instance="alice-a"))
    assert worker.send_one(accepted["id"]) == "sent"
    assert Message.objects.get(pk=accepted["id"]).instance == first


def test_an_inbound_message_makes_the_sender_a_known_contact(alice, numbers):
    first, _ = numbers
    assert sending_helpers.is_cold(first.pk, "+5511988887777")
    event, _ = inbox.record("WEBHOOK", inbound("Olá, tudo bem?", instance="alice-a"))
    handlers.apply(event)
    assert not sending_helpers.is_cold(first.pk, "+5511988887777")
    assert Contact.objects.get(instance=first).last_direction == "inbound"


def test_a_resting_number_that_knows_the_recipient_is_passed_over(simulator, alice, numbers):
    first, second = numbers
    open_on_simulator(simulator, first, second)
    sending_helpers.exchanged(first.pk, RECIPIENT, timezone.now() - timedelta(days=3))
    exchanges.received(second.name, RECIPIENT, timezone.now() - timedelta(hours=1))
    Instance.objects.filter(pk=second.pk).update(health_state="resting")
    [message_id] = queue(alice, "UTILITY", 1, to=RECIPIENT)
    assert worker.send_one(message_id) == "sent"
    assert Message.objects.get(pk=message_id).instance == first  # the other number that knows them
    assert sends_ok(simulator, "alice-b") == []


def test_a_cold_contact_leaves_a_cooling_number_for_one_that_may_write_to_strangers(simulator, alice, numbers):
    first, second = numbers
    open_on_simulator(simulator, first, second)
    Instance.objects.filter(pk=first.pk).update(health_state="at_risk",
                                                cold_paused_until=timezone.now() + timedelta(hours=12))
    [message_id] = queue(alice, "UTILITY", 1, to=RECIPIENT)
    assert worker.send_one(message_id) == "sent"
    message = Message.objects.get(pk=message_id)
    assert message.instance == second
    assert events(message, "REROUTED")[0]["why"] == "no cold contacts left on its number"


def test_known_pairs_reads_a_whole_pass_in_one_query(alice, numbers, django_assert_num_queries):
    first, second = numbers
    exchanges.received(first.name, "+5531999999999", timezone.now())
    # Brazil's ninth digit either way: the jid's form without it is the same recipient.
    with django_assert_num_queries(1):
        known = exchanges.known_pairs([(first.pk, "+553199999999"), (second.pk, "+5531999999999"),
                                       (first.pk, RECIPIENT)])
    assert known == {(first.pk, "+553199999999")}
