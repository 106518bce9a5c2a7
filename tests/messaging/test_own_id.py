"""Issue 48: every send carries our own WhatsApp id, so a lost answer is looked up, not inferred. Against the
simulator over real HTTP, on real Postgres and Redis; time passing between attempts is explicit (make_due)."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from ingestion import handlers
from messaging import lifecycle, resend
from messaging.models import DeadLetter, FailureReason, Instance, Message, Status
from messaging.sending import answers, gateway, worker
from tests.messaging.sending_helpers import RECIPIENT, events, make_due, open_on_simulator, send, sends_ok

LOST = {"hang_rate": 1.0, "hang_ms": 1500}
BAILEYS_ID = re.compile(r"3EB0[0-9A-F]{18}\Z")


@pytest.fixture
def short_timeouts(settings):
    settings.EVOLUTION_READ_TIMEOUT = 0.5
    settings.BREAKER_FAILURE_RUN = 100
    settings.UNCONFIRMED_SETTLE_SECONDS = 0


def lose_answers(simulator, instance, after_send: bool) -> None:
    simulator.faults(instance.name, hang_after_send=after_send, **LOST)


def answer_again(simulator, instance) -> None:
    simulator.faults(instance.name, hang_rate=0.0, hang_after_send=False)


def learn_that_ids_are_honoured(simulator, alice, instance) -> None:
    """One send answered: the instance is known to send with our ids."""
    first = send(alice, to="+5511977776666")
    assert worker.send_one(str(first.pk)) == "sent"
    instance.refresh_from_db()
    assert instance.honours_message_id is True


def calls(simulator, instance, message) -> list[dict]:
    return [s for s in simulator.sends(instance=instance.name) if s.get("message_id") == message.own_message_id]


def phone_twin(simulator, instance, message, **fields) -> dict:
    """The same text typed on the account's phone to the same number, now (inside the attempt's window)."""
    return simulator.phone_message(instance.name, RECIPIENT, message.text, **fields)


# -- 1. a phone-typed twin is no proof ------------------------------------------------------------------------


def test_a_phone_typed_twin_does_not_make_a_lost_answer_sent(simulator, alice, alice_instance, short_timeouts):
    # given: the answer is lost before Evolution sent anything, and the owner types the same text on the phone
    open_on_simulator(simulator, alice_instance)
    learn_that_ids_are_honoured(simulator, alice, alice_instance)
    lose_answers(simulator, alice_instance, after_send=False)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    answer_again(simulator, alice_instance)
    twin = phone_twin(simulator, alice_instance, message)

    # when: its next claim asks Evolution
    make_due(message)
    assert worker.send_one(str(message.pk)) == "sent"

    # then: the twin was not taken; our message went out once, with our id
    message.refresh_from_db()
    assert message.evolution_message_id == message.own_message_id != twin["key"]["id"]
    assert events(message, "CHECKED")[0]["verdict"] == "not_sent"
    assert len([s for s in calls(simulator, alice_instance, message) if s.get("reached")]) == 1


@pytest.mark.parametrize("device", ["android", "ios", "web"])
def test_a_phone_typed_twin_is_no_proof_on_an_evolution_that_ignores_our_ids(
    simulator, alice, alice_instance, short_timeouts, device
):
    # given: an older Evolution (messageId ignored); the answer is lost before it sent anything; a twin typed on a
    # device of the account, with the same text to the same number inside the attempt's window
    open_on_simulator(simulator, alice_instance)
    simulator.instance(alice_instance.name, ignore_message_id=True)
    lose_answers(simulator, alice_instance, after_send=False)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    answer_again(simulator, alice_instance)
    twin = phone_twin(simulator, alice_instance, message, device=device)

    make_due(message)
    outcome = worker.send_one(str(message.pk))

    # then: never SENT on the twin's id. A twin from a phone app is told apart (its id and source), and the
    # message is sent; one typed on WhatsApp Web looks like ours but has no server ack: the outcome stays open.
    message.refresh_from_db()
    assert message.evolution_message_id != twin["key"]["id"]
    if device == "web":
        assert outcome == "unknown" and message.status == Status.QUEUED and message.outcome_unknown
        assert sends_ok(simulator, alice_instance.name) == []
    else:
        assert outcome == "sent" and message.status == Status.SENT
        assert [s["id"] for s in sends_ok(simulator, alice_instance.name)] == [message.evolution_message_id]


# -- 2. our id on every send ------------------------------------------------------------------------------------


def test_every_send_carries_an_id_in_baileys_format_chosen_before_the_first_attempt(
    simulator, alice, alice_instance, short_timeouts
):
    open_on_simulator(simulator, alice_instance)
    message = send(alice)
    assert message.own_message_id == ""  # chosen by the worker, not at accept

    assert worker.send_one(str(message.pk)) == "sent"

    message.refresh_from_db()
    assert BAILEYS_ID.match(message.own_message_id)
    [call] = simulator.sends(instance=alice_instance.name)
    assert call["message_id"] == message.own_message_id == message.evolution_message_id == call["id"]
    alice_instance.refresh_from_db()
    assert alice_instance.honours_message_id is True


def test_an_evolution_that_ignores_our_id_is_marked_and_its_id_is_used(
    simulator, alice, alice_instance, short_timeouts, caplog
):
    open_on_simulator(simulator, alice_instance)
    simulator.instance(alice_instance.name, ignore_message_id=True)
    message = send(alice)

    assert worker.send_one(str(message.pk)) == "sent"

    message.refresh_from_db()
    [call] = simulator.sends(instance=alice_instance.name)
    assert call["message_id"] == message.own_message_id != call["id"]
    assert message.evolution_message_id == call["id"]
    alice_instance.refresh_from_db()
    assert alice_instance.honours_message_id is False
    assert any("ignores the field" in r.getMessage() for r in caplog.records)


def test_a_retry_keeps_the_id_of_its_attempt_chain(simulator, alice, alice_instance, short_timeouts):
    open_on_simulator(simulator, alice_instance)
    simulator.faults(alice_instance.name, error_rate=1.0, error_status=500)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    simulator.faults(alice_instance.name, error_rate=0.0)
    make_due(message)
    assert worker.send_one(str(message.pk)) == "sent"

    message.refresh_from_db()
    asked = [s["message_id"] for s in simulator.sends(instance=alice_instance.name)]
    assert asked == [message.own_message_id] * 2


# -- 3. a lost answer is looked up by our id ----------------------------------------------------------------------


def test_a_lost_answer_found_by_its_id_is_sent_where_inference_could_not_tell(
    simulator, alice, alice_instance, short_timeouts
):
    # given: two messages with the same text to the same number, both sent, both answers lost: by number, text and
    # window each record could be either's
    open_on_simulator(simulator, alice_instance)
    learn_that_ids_are_honoured(simulator, alice, alice_instance)
    lose_answers(simulator, alice_instance, after_send=True)
    b, c = send(alice), send(alice)
    assert worker.send_one(str(b.pk)) == "retry"
    assert worker.send_one(str(c.pk)) == "retry"
    answer_again(simulator, alice_instance)

    make_due(b)
    make_due(c)
    assert worker.send_one(str(b.pk)) == "confirmed_sent"
    assert worker.send_one(str(c.pk)) == "confirmed_sent"

    # then: each is SENT on its own record, found by its own id, and neither was sent again
    b.refresh_from_db()
    c.refresh_from_db()
    assert b.status == c.status == Status.SENT and not b.outcome_unknown and not c.outcome_unknown
    assert b.evolution_message_id == b.own_message_id and c.evolution_message_id == c.own_message_id
    assert events(b, "CHECKED")[0]["by"] == "ownId"
    assert len(sends_ok(simulator, alice_instance.name)) == 3


def test_a_lost_answer_not_found_is_retried_once_with_the_same_id_and_sent_once(
    simulator, alice, alice_instance, short_timeouts
):
    open_on_simulator(simulator, alice_instance)
    learn_that_ids_are_honoured(simulator, alice, alice_instance)
    lose_answers(simulator, alice_instance, after_send=False)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    answer_again(simulator, alice_instance)

    make_due(message)
    assert worker.send_one(str(message.pk)) == "sent"

    message.refresh_from_db()
    tried = calls(simulator, alice_instance, message)
    assert len(tried) == 2 and [s for s in tried if s.get("reached")] == [tried[1]]
    assert message.status == Status.SENT and message.evolution_message_id == message.own_message_id == tried[1]["id"]
    assert events(message, "CHECKED")[0] == {"verdict": "not_sent", "by": "ownId"}


def test_not_found_before_the_gateway_has_settled_is_asked_again_then(
    simulator, alice, alice_instance, short_timeouts, settings
):
    open_on_simulator(simulator, alice_instance)
    learn_that_ids_are_honoured(simulator, alice, alice_instance)
    settings.UNCONFIRMED_SETTLE_SECONDS = 60
    lose_answers(simulator, alice_instance, after_send=False)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    message.refresh_from_db()
    assert message.next_attempt_at >= message.unconfirmed_attempt_until  # not due before Evolution settled
    answer_again(simulator, alice_instance)

    # when: it is claimed sooner all the same (a recovered lease, say)
    Message.objects.filter(pk=message.pk).update(next_attempt_at=timezone.now())
    assert worker.send_one(str(message.pk)) == "unknown"

    # then: not sent again, due once Evolution has settled
    message.refresh_from_db()
    assert message.status == Status.QUEUED and len(calls(simulator, alice_instance, message)) == 1
    assert message.next_attempt_at >= message.unconfirmed_attempt_until


def test_evolution_unreachable_leaves_the_outcome_unknown(simulator, alice, alice_instance, short_timeouts, settings):
    open_on_simulator(simulator, alice_instance)
    learn_that_ids_are_honoured(simulator, alice, alice_instance)
    lose_answers(simulator, alice_instance, after_send=False)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    settings.EVOLUTION_API_URL = "http://127.0.0.1:1"

    make_due(message)
    assert worker.send_one(str(message.pk)) == "unknown"
    message.refresh_from_db()
    assert message.outcome_unknown and message.status == Status.QUEUED


# -- 4. receipts that overtake the answer -------------------------------------------------------------------------


def claimed(alice) -> tuple[Message, object]:
    message = send(alice)
    got = worker.claim(str(message.pk))
    assert got is not None
    return got.message, got.token


def answer_for(message: Message, key_id: str | None = None) -> gateway.Outcome:
    return gateway.classify(201, {"key": {"remoteJid": "5511988887777@s.whatsapp.net", "fromMe": True,
                                          "id": key_id or message.own_message_id}, "status": "PENDING"})


def receipt(instance, key_id: str, status: str) -> dict:
    return {"event": "messages.update", "instance": instance.name, "data": {
        "keyId": key_id, "remoteJid": "5511988887777@s.whatsapp.net", "fromMe": True, "status": status,
        "instanceId": "0b5e2f4c-7d1a-4c3e-9f62-8a1b2c3d4e5f", "messageId": "cmh0k2x5a0001qz8w3v7y9abc"}}


def test_a_receipt_that_overtakes_the_answer_matches_at_once(alice, alice_instance):
    message, token = claimed(alice)
    assert BAILEYS_ID.match(message.own_message_id)

    # when: the receipts come before sendText's answer is recorded
    assert handlers.ingest("WEBHOOK", receipt(alice_instance, message.own_message_id, "SERVER_ACK")) == "applied"
    assert handlers.ingest("WEBHOOK", receipt(alice_instance, message.own_message_id, "DELIVERY_ACK")) == "applied"
    row = Message.objects.get(pk=message.pk)
    assert row.status == Status.DELIVERED and row.evolution_message_id == message.own_message_id
    assert [e["status"] for e in events(row, "STATUS")] == ["SENT", "SERVER_ACK", "DELIVERED"]

    # then: the answer joins the message, which stays DELIVERED, lease ended
    assert answers.apply_outcome(message, token, alice_instance, answer_for(message)) == "sent"
    row.refresh_from_db()
    assert row.status == Status.DELIVERED and row.lease_token is None and row.attempts == 1
    assert row.sent_at is not None and row.remote_jid == "5511988887777@s.whatsapp.net"
    assert [e["outcome"] for e in events(row, "ATTEMPT")] == ["sent"]


def test_a_receipt_that_overtakes_a_lost_answer_settles_it(alice, alice_instance):
    message, token = claimed(alice)
    assert handlers.ingest("WEBHOOK", receipt(alice_instance, message.own_message_id, "SERVER_ACK")) == "applied"

    assert answers.apply_outcome(message, token, alice_instance, gateway.Outcome(gateway.UNKNOWN, detail="read timeout")) == "sent"

    row = Message.objects.get(pk=message.pk)
    assert row.status == Status.SERVER_ACK and not row.outcome_unknown and row.lease_token is None
    assert row.attempts == 1


def test_a_receipt_after_a_lost_answer_settles_the_waiting_message(alice, alice_instance):
    # given: the answer was lost; the message waits for its check, its outcome unknown
    message, token = claimed(alice)
    assert answers.apply_outcome(message, token, alice_instance, gateway.Outcome(gateway.UNKNOWN, detail="read timeout")) == "retry"
    assert Message.objects.get(pk=message.pk).outcome_unknown

    # when: WhatsApp's receipt for our id arrives
    assert handlers.ingest("WEBHOOK", receipt(alice_instance, message.own_message_id, "DELIVERY_ACK")) == "applied"

    # then: sent, delivered, no longer unknown, and no claim left to make
    row = Message.objects.get(pk=message.pk)
    assert row.status == Status.DELIVERED and not row.outcome_unknown and row.unconfirmed_attempt_at is None
    assert [e["status"] for e in events(row, "STATUS")] == ["SENT", "DELIVERED"]
    assert worker.send_one(str(message.pk)) == worker.NOTHING_TO_CLAIM


def test_an_error_receipt_that_overtakes_the_answer_fails_the_message(alice, alice_instance):
    message, token = claimed(alice)
    assert handlers.ingest("WEBHOOK", receipt(alice_instance, message.own_message_id, "ERROR")) == "failed"

    answers.apply_outcome(message, token, alice_instance, answer_for(message))

    row = Message.objects.get(pk=message.pk)
    assert row.status == Status.FAILED and row.failure_reason == FailureReason.REJECTED
    assert row.evolution_message_id == message.own_message_id


# -- 5. a resend gets a new id ----------------------------------------------------------------------------------------


def test_a_resend_gets_a_new_id(simulator, alice, alice_instance, short_timeouts):
    open_on_simulator(simulator, alice_instance)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "sent"
    message.refresh_from_db()
    first = message.own_message_id
    assert handlers.ingest("WEBHOOK", receipt(alice_instance, first, "ERROR")) == "failed"

    assert resend.force_resend(DeadLetter.objects.get(message=message), "dashboard:bob").outcome == resend.RESENT
    assert worker.send_one(str(message.pk)) == "sent"

    message.refresh_from_db()
    assert message.own_message_id != first and BAILEYS_ID.match(message.own_message_id)
    assert [s["message_id"] for s in simulator.sends(instance=alice_instance.name)] == [first, message.own_message_id]


def test_the_instance_is_told_apart_for_each_answer(alice, alice_instance):
    # An instance once seen ignoring our ids, then honouring them (Evolution upgraded): the latest answer wins.
    Instance.objects.filter(pk=alice_instance.pk).update(honours_message_id=False)
    message, token = claimed(alice)
    assert answers.apply_outcome(message, token, message.instance, answer_for(message)) == "sent"
    alice_instance.refresh_from_db()
    assert alice_instance.honours_message_id is True
    assert lifecycle.sources("answer_after_receipts") == ("SERVER_ACK", "DELIVERED", "READ")
