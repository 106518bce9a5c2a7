"""Issue 22: a lost answer is decided on evidence only. Against the simulator over real HTTP, on real
Postgres and Redis; time passing between attempts is explicit (make_due).

Here on an Evolution that ignores the WhatsApp id we choose (older than `messageId`), where a lost answer is
judged on number, text and window; on one that honours it, it is looked up by that id (test_own_id.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from messaging import reconciler
from messaging.models import Message
from messaging.sending import worker
from tests.messaging.sending_helpers import (
    RECIPIENT,
    assert_dead_lettered,
    events,
    make_due,
    send,
    sends_ok,
)
from tests.messaging.sending_helpers import open_on_simulator as open_honouring_ids

LOST = {"hang_rate": 1.0, "hang_ms": 1500}


@pytest.fixture
def short_timeouts(settings):
    settings.EVOLUTION_READ_TIMEOUT = 0.5
    settings.BREAKER_FAILURE_RUN = 100


def open_on_simulator(simulator, *instances) -> None:
    open_honouring_ids(simulator, *instances)
    for instance in instances:
        simulator.instance(instance.name, ignore_message_id=True)


def lose_answers(simulator, instance, after_send: bool) -> None:
    simulator.faults(instance.name, hang_after_send=after_send, **LOST)


def answer_again(simulator, instance) -> None:
    simulator.faults(instance.name, hang_rate=0.0, hang_after_send=False)


def test_a_lost_answer_is_not_resolved_with_another_messages_send(simulator, alice, alice_instance, short_timeouts):
    # given: B's attempt times out without sending; then C, the same text to the same number, is sent
    open_on_simulator(simulator, alice_instance)
    lose_answers(simulator, alice_instance, after_send=False)
    b = send(alice)
    assert worker.send_one(str(b.pk)) == "retry"
    answer_again(simulator, alice_instance)
    c = send(alice)
    assert worker.send_one(str(c.pk)) == "sent"

    # when: B's next claim asks Evolution about its lost answer
    make_due(b)
    assert worker.send_one(str(b.pk)) == "sent"

    # then: C's record was not B's to take; B was sent for real, each with its own id
    b.refresh_from_db()
    c.refresh_from_db()
    sent = sends_ok(simulator, alice_instance.name)
    assert len(sent) == 2
    assert {b.evolution_message_id, c.evolution_message_id} == {s["id"] for s in sent}
    assert events(b, "CHECKED")[0]["verdict"] == "not_sent"
    assert b.outcome_unknown_since is None and not b.outcome_unknown


def test_two_identical_texts_with_the_first_answer_lost_after_sending_end_right(
    simulator, alice, alice_instance, short_timeouts
):
    open_on_simulator(simulator, alice_instance)
    lose_answers(simulator, alice_instance, after_send=True)
    b = send(alice)
    assert worker.send_one(str(b.pk)) == "retry"
    answer_again(simulator, alice_instance)
    c = send(alice)
    assert worker.send_one(str(c.pk)) == "sent"

    make_due(b)
    assert worker.send_one(str(b.pk)) == "confirmed_sent"

    b.refresh_from_db()
    c.refresh_from_db()
    sent = sends_ok(simulator, alice_instance.name)
    assert len(sent) == 2  # neither was sent twice
    assert b.status == c.status == "SENT"
    assert b.evolution_message_id == sent[0]["id"] and c.evolution_message_id == sent[1]["id"]


def test_a_record_outside_the_attempts_window_is_not_taken(simulator, alice, alice_instance, short_timeouts):
    # given: B's answer was lost before sending, long ago; C (same text) was sent since, its answer lost too
    open_on_simulator(simulator, alice_instance)
    lose_answers(simulator, alice_instance, after_send=False)
    b = send(alice)
    assert worker.send_one(str(b.pk)) == "retry"
    b.refresh_from_db()
    Message.objects.filter(pk=b.pk).update(
        unconfirmed_attempt_at=b.unconfirmed_attempt_at - timedelta(minutes=2),
        unconfirmed_attempt_until=(b.unconfirmed_attempt_until or timezone.now()) - timedelta(minutes=2),
    )
    lose_answers(simulator, alice_instance, after_send=True)
    c = send(alice)
    assert worker.send_one(str(c.pk)) == "retry"
    answer_again(simulator, alice_instance)

    # when: both are checked
    make_due(b)
    make_due(c)
    assert worker.send_one(str(b.pk)) == "sent"  # C's record is outside B's window: B was not sent
    assert worker.send_one(str(c.pk)) == "confirmed_sent"

    b.refresh_from_db()
    c.refresh_from_db()
    sent = sends_ok(simulator, alice_instance.name)
    assert len(sent) == 2 and c.evolution_message_id == sent[0]["id"] and b.evolution_message_id == sent[1]["id"]


def test_several_candidates_stay_unknown_then_fail_outcome_unknown(simulator, alice, alice_instance, short_timeouts):
    # given: two identical messages, both sent, both answers lost, inside each other's window
    open_on_simulator(simulator, alice_instance)
    lose_answers(simulator, alice_instance, after_send=True)
    b, c = send(alice), send(alice)
    Message.objects.filter(pk__in=[b.pk, c.pk]).update(max_attempts=2)
    assert worker.send_one(str(b.pk)) == "retry"
    assert worker.send_one(str(c.pk)) == "retry"
    answer_again(simulator, alice_instance)

    # when: B is checked: two records could be B's
    make_due(b)
    assert worker.send_one(str(b.pk)) == "unknown"

    # then: B is neither sent again nor marked sent, and says so
    b.refresh_from_db()
    assert b.status == "QUEUED" and b.evolution_message_id == "" and b.outcome_unknown_since is not None
    body = alice.client().get(f"/v1/messages/{b.pk}").json()
    assert body["outcomeUnknown"] is True and body["outcomeUnknownSince"]
    assert len(sends_ok(simulator, alice_instance.name)) == 2

    # when: its deadline passes while still unknown
    Message.objects.filter(pk=b.pk).update(next_attempt_at=timezone.now(), deliver_until=timezone.now())
    assert worker.send_one(str(b.pk)) == "outcome_unknown"
    letter = assert_dead_lettered(b, "OUTCOME_UNKNOWN")
    assert "may have been delivered" in letter.detail
    assert len(sends_ok(simulator, alice_instance.name)) == 2
    body = alice.client().get(f"/v1/messages/{b.pk}").json()
    assert body["failureReason"] == "OUTCOME_UNKNOWN" and body["outcomeUnknown"] is True


def test_a_lid_chat_is_found(simulator, alice, alice_instance, short_timeouts):
    # given: WhatsApp addresses this contact by LID, and Evolution files the chat under it
    open_on_simulator(simulator, alice_instance)
    simulator.instance(alice_instance.name, lids={RECIPIENT: "123456789012345@lid"})
    lose_answers(simulator, alice_instance, after_send=True)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    answer_again(simulator, alice_instance)

    make_due(message)
    assert worker.send_one(str(message.pk)) == "confirmed_sent"
    message.refresh_from_db()
    sent = sends_ok(simulator, alice_instance.name)
    assert len(sent) == 1 and message.evolution_message_id == sent[0]["id"]
    assert message.remote_jid == "123456789012345@lid"


def test_a_last_attempt_that_timed_out_asks_evolution_before_failing(simulator, alice, alice_instance, short_timeouts):
    # given: the last attempt of the budget is sent, but its answer is lost
    open_on_simulator(simulator, alice_instance)
    lose_answers(simulator, alice_instance, after_send=True)
    message = send(alice)
    Message.objects.filter(pk=message.pk).update(max_attempts=1)
    assert worker.send_one(str(message.pk)) == "retry"  # not failed: Evolution is asked first
    message.refresh_from_db()
    assert message.status == "QUEUED" and message.outcome_unknown_since is not None

    make_due(message)
    assert worker.send_one(str(message.pk)) == "confirmed_sent"
    assert Message.objects.get(pk=message.pk).status == "SENT"
    assert len(sends_ok(simulator, alice_instance.name)) == 1


def test_a_last_attempt_not_sent_fails_with_what_is_known(simulator, alice, alice_instance, short_timeouts):
    open_on_simulator(simulator, alice_instance)
    lose_answers(simulator, alice_instance, after_send=False)
    message = send(alice, "OTP")
    assert worker.send_one(str(message.pk)) == "retry"
    Message.objects.filter(pk=message.pk).update(next_attempt_at=timezone.now(), deliver_until=timezone.now())
    answer_again(simulator, alice_instance)

    assert worker.send_one(str(message.pk)) == "failed"
    letter = assert_dead_lettered(message, "EXPIRED")
    assert "not sent" in letter.detail
    assert sends_ok(simulator, alice_instance.name) == []


def test_evolution_unreachable_at_the_deadline_fails_outcome_unknown_not_expired(
    simulator, alice, alice_instance, short_timeouts, settings
):
    open_on_simulator(simulator, alice_instance)
    lose_answers(simulator, alice_instance, after_send=True)
    message = send(alice, "OTP")
    assert worker.send_one(str(message.pk)) == "retry"
    Message.objects.filter(pk=message.pk).update(next_attempt_at=timezone.now(), deliver_until=timezone.now())
    settings.EVOLUTION_API_URL = "http://127.0.0.1:1"  # nothing listens: Evolution cannot be asked

    assert worker.send_one(str(message.pk)) == "outcome_unknown"
    assert_dead_lettered(message, "OUTCOME_UNKNOWN")


def test_the_reconciler_leaves_an_unknown_message_past_its_deadline_to_the_worker(
    simulator, alice, alice_instance, short_timeouts, settings
):
    open_on_simulator(simulator, alice_instance)
    lose_answers(simulator, alice_instance, after_send=True)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    Message.objects.filter(pk=message.pk).update(deliver_until=timezone.now() - timedelta(seconds=1))

    assert reconciler.expire_overdue() == 0  # the worker asks Evolution first
    Message.objects.filter(pk=message.pk).update(
        deliver_until=timezone.now() - timedelta(seconds=settings.UNCONFIRMED_GRACE_SECONDS + 1)
    )
    assert reconciler.expire_overdue() == 1
    assert_dead_lettered(message, "OUTCOME_UNKNOWN")


def test_one_whatsapp_id_belongs_to_one_message(alice, alice_instance):
    from tests.messaging.sending_helpers import queue

    first, second = queue(alice, "UTILITY", 2)
    Message.objects.filter(pk=first).update(evolution_message_id="3EB0AAAAAAAAAAAAAAAAAA")
    with pytest.raises(IntegrityError), transaction.atomic():
        Message.objects.filter(pk=second).update(evolution_message_id="3EB0AAAAAAAAAAAAAAAAAA")
