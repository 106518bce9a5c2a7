"""Consent at send time (issue 47 §5): an opt-out ends every queued non-OTP message to that number (FAILED
OPTED_OUT, a dead letter that no one can force-resend without a new opt-in), and a claim checks the opt-in
again, so a message whose consent ended while it sat in the outbox or a lane's queue never goes out."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import requests
from django.test import Client
from django.utils import timezone

from messaging import consent, opt_ins
from messaging.models import DeadLetter, FailureReason, Message, OptIn, OutboxEntry, Status
from messaging.sending import worker
from tests.conftest import add_instance
from tests.ingestion.test_inbound_opt_out import inbound, ingest
from tests.messaging.sending_helpers import RECIPIENT, assert_dead_lettered, make_due, open_on_simulator, send, sends_ok
from tests.support.simulator import wait_until

SENDER_JID = "5511988887777@s.whatsapp.net"


def statuses(messages: list[Message]) -> list[tuple[str, str]]:
    return [(m.status, m.failure_reason) for m in Message.objects.filter(pk__in=[m.pk for m in messages])]


def held_while_disconnected(simulator: Any, actor: Any, instance: Any, count: int, category: str = "MARKETING") -> list[Message]:
    """`count` messages to RECIPIENT, each claimed once and held back because the instance is not connected."""
    open_on_simulator(simulator, instance)
    simulator.instance(instance.name, state="close")
    messages = [send(actor, category=category) for _ in range(count)]
    for message in messages:
        assert worker.send_one(str(message.pk)) == "held"
    assert all(status == Status.QUEUED for status, _ in statuses(messages))
    return messages


def instance_returns(simulator: Any, instance: Any, messages: list[Message]) -> list[str]:
    """The instance connects again and every message's next claim runs."""
    from django_redis import get_redis_connection

    simulator.instance(instance.name, state="open")
    get_redis_connection("default").flushdb()  # the remembered `close` state
    outcomes = []
    for message in messages:
        make_due(message)
        outcomes.append(worker.send_one(str(message.pk)))
    return outcomes


def assert_opted_out(messages: list[Message]) -> list[DeadLetter]:
    letters = [assert_dead_lettered(m, FailureReason.OPTED_OUT) for m in messages]
    assert not OutboxEntry.objects.filter(message__in=messages).exists()
    return letters


def test_a_parar_reply_fails_four_held_marketing_messages_and_none_goes_out(simulator, alice, alice_instance):
    # given: four MARKETING messages held while alice's instance is disconnected
    messages = held_while_disconnected(simulator, alice, alice_instance, 4)

    # when: the recipient replies "Parar", then the instance comes back
    outcome, _ = ingest(inbound("Parar"))
    outcomes = instance_returns(simulator, alice_instance, messages)

    # then: none goes out; all four are FAILED OPTED_OUT with a dead letter
    assert outcome == "opt_out_revoked"
    assert outcomes == [worker.NOTHING_TO_CLAIM] * 4
    assert sends_ok(simulator, alice_instance.name) == []
    letters = assert_opted_out(messages)
    assert all("opt-out" in letter.detail for letter in letters)


def test_an_opted_out_dead_letter_refuses_force_resend_until_a_new_opt_in(simulator, alice, alice_instance, bob):
    [message] = held_while_disconnected(simulator, alice, alice_instance, 1)
    ingest(inbound("STOP"))
    [letter] = assert_opted_out([message])

    # the API refuses, with a clear error, and changes nothing
    answer = alice.client().post(f"/v1/dead-letters/{letter.pk}/resend", {}, format="json")
    assert answer.status_code == 422, answer.content
    error = answer.json()["error"]
    assert error["code"] == "opted_out" and "opt-in" in error["message"]
    assert error["details"]["reason"] == FailureReason.OPTED_OUT
    # so does the dashboard, and its bulk resend counts it refused
    browser = Client()
    browser.force_login(bob)
    page = browser.post(f"/dashboard/p/{alice.project.pk}/dead-letters/{letter.pk}/resend", follow=True)
    assert b"opted_out" in page.content
    letter.refresh_from_db()
    assert letter.status == "OPEN" and Message.objects.get(pk=message.pk).status == Status.FAILED

    # a new opt-in lets it go again
    opt_ins.record(alice.project, RECIPIENT, "asked again at checkout")
    answer = alice.client().post(f"/v1/dead-letters/{letter.pk}/resend", {}, format="json")
    assert answer.status_code == 200, answer.content
    assert Message.objects.get(pk=message.pk).status == Status.QUEUED


@pytest.mark.parametrize("key", [{"remoteJidAlt": SENDER_JID}, {"senderPn": SENDER_JID}])
def test_a_lid_sender_fails_the_queued_messages_too(simulator, alice, alice_instance, key):
    messages = held_while_disconnected(simulator, alice, alice_instance, 2)

    assert ingest(inbound("SAIR", jid="123456789012345@lid", **key))[0] == "opt_out_revoked"

    assert instance_returns(simulator, alice_instance, messages) == [worker.NOTHING_TO_CLAIM] * 2
    assert_opted_out(messages)


def test_an_otp_and_other_numbers_and_projects_are_left_alone(simulator, alice, carol, alice_instance):
    other = "+5511977776666"
    marketing = held_while_disconnected(simulator, alice, alice_instance, 1)
    otp = send(alice, category="OTP")
    to_another_number = send(alice, category="UTILITY", to=other)
    add_instance(carol.project, "carol-main")
    carols = send(carol, category="UTILITY")

    ingest(inbound("STOP"))

    assert_opted_out(marketing)
    assert statuses([otp, to_another_number, carols]) == [(Status.QUEUED, "")] * 3


def test_a_stop_revokes_and_fails_in_both_environments(simulator, alice, alice_instance):
    # TEST's consent for the project's test number, LIVE's for another: the person's word ends both.
    phone = alice.project.test_number
    opt_ins.record(alice.project, phone, "form", environment="TEST")
    body = {"to": phone, "category": "UTILITY", "text": "hi"}
    answer = alice.client(live=False).post("/v1/messages/send", body, format="json")
    assert answer.status_code == 202, answer.content
    queued_test = Message.objects.get(pk=answer.json()["id"])
    opt_ins.record(alice.project, phone, "form")
    queued_live = send(alice, category="UTILITY", to=phone)

    ingest(inbound("STOP", jid=phone.lstrip("+") + "@s.whatsapp.net"))

    assert not OptIn.objects.filter(project=alice.project, phone=phone, revoked_at__isnull=True).exists()
    assert_opted_out([queued_test, queued_live])


def test_an_api_revocation_fails_the_queued_messages_of_its_environment(simulator, alice, alice_instance):
    messages = held_while_disconnected(simulator, alice, alice_instance, 2, category="UTILITY")

    answer = alice.client().delete(f"/v1/opt-ins/{RECIPIENT}")

    assert answer.status_code in (200, 204), answer.content
    assert_opted_out(messages)


# ---- a shared instance ------------------------------------------------------------------------

def test_a_stop_to_a_shared_instance_ends_every_projects_consent_for_that_number(simulator, alice, carol):
    # given: no project has an instance of its own, so UTILITY goes through Pilot Status' shared number
    shared = add_instance(None, "pilot-shared", priority=5)
    alices = send(alice, category="UTILITY")
    carols = send(carol, category="UTILITY")
    otp = send(alice, category="OTP")
    assert {m.instance_id for m in (alices, carols, otp)} == {shared.pk}

    # when: the recipient writes STOP to that number
    outcome, _ = ingest(inbound("STOP", instance=shared.name))

    # then: both projects' opt-ins end (a person sees one chat per number), their queued messages with them
    assert outcome == "opt_out_revoked"
    assert not OptIn.objects.filter(phone=RECIPIENT, revoked_at__isnull=True).exists()
    assert OptIn.objects.filter(phone=RECIPIENT, revoked_source="inbound_keyword").count() == 2
    assert_opted_out([alices, carols])
    assert statuses([otp]) == [(Status.QUEUED, "")]


def test_a_stop_to_a_shared_instance_uses_the_default_keywords(simulator, alice):
    shared = add_instance(None, "pilot-shared", priority=5)
    alice.project.opt_out_keywords = ["CHEGA"]  # a project's own list speaks for its own numbers only
    alice.project.save()
    message = send(alice, category="UTILITY")

    assert ingest(inbound("chega", instance=shared.name))[0] == "stored"
    assert ingest(inbound("Sair", instance=shared.name))[0] == "opt_out_revoked"
    assert_opted_out([message])


# ---- at claim time ----------------------------------------------------------------------------

def revoke_behind_the_scan(actor: Any, phone: str = RECIPIENT) -> None:
    """The consent ends without the withdrawal of the queued messages: the revocation committed after a claim's
    scan, or was written by hand."""
    OptIn.objects.filter(project=actor.project, phone=phone).update(revoked_at=timezone.now(), revoked_by="test")


def test_a_claim_without_consent_fails_opted_out_and_sends_nothing(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance)
    message = send(alice, category="MARKETING")
    revoke_behind_the_scan(alice)

    assert worker.send_one(str(message.pk)) == "opted_out"

    assert sends_ok(simulator, alice_instance.name) == []
    assert_dead_lettered(message, FailureReason.OPTED_OUT)


def test_a_claimed_otp_goes_without_consent(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance)
    message = send(alice, category="OTP")
    revoke_behind_the_scan(alice)

    assert worker.send_one(str(message.pk)) == "sent"


def test_a_claimed_message_to_a_magic_number_is_checked_too(alice, alice_instance):
    phone = "+12015550100"
    opt_ins.record(alice.project, phone, "form", environment="TEST")
    answer = alice.client(live=False).post("/v1/messages/send", {"to": phone, "category": "UTILITY", "text": "hi"},
                                           format="json")
    assert answer.status_code == 202, answer.content
    OptIn.objects.filter(project=alice.project, phone=phone).update(revoked_at=timezone.now())

    assert worker.send_one(answer.json()["id"]) == "opted_out"


@pytest.mark.parametrize("category, opted_in, allowed", [
    ("OTP", False, True), ("OTP", True, True),
    ("UTILITY", True, True), ("UTILITY", False, False),
    ("MARKETING", True, True), ("MARKETING", False, False),
])
def test_the_rule(category, opted_in, allowed):
    assert consent.may_send(category, opted_in) is allowed


# ---- the real stack ---------------------------------------------------------------------------

def test_the_issues_run_four_held_marketing_messages_a_parar_and_a_reconnect(stack, simulator, alice, alice_instance):
    # given: four MARKETING messages held while alice's instance is disconnected
    simulator.register(alice_instance, stack.webhook_url)
    simulator.instance(alice_instance.name, state="close")
    opt_ins.record(alice.project, RECIPIENT, "checkout")
    ids = []
    for i in range(4):
        answer = requests.post(f"{stack.web_url}/v1/messages/send",
                               headers={"Authorization": f"Bearer {alice.live_key}"},
                               json={"to": RECIPIENT, "category": "MARKETING", "text": f"Sale {i}"}, timeout=30)
        assert answer.status_code == 202, answer.text
        ids.append(answer.json()["id"])
    wait_until(lambda: Message.objects.filter(pk__in=ids, events__kind="WAITING").distinct().count() == 4,
               timeout=60, message="all four held while disconnected")

    # when: the recipient replies "Parar" (webhook and RabbitMQ), then the phone reconnects
    simulator.emit(alice_instance.name, "messages.upsert", copy.deepcopy(inbound("Parar")["data"]))
    wait_until(lambda: not OptIn.objects.filter(project=alice.project, revoked_at__isnull=True).exists(),
               timeout=30, message="the opt-in revoked")
    simulator.instance(alice_instance.name, state="open")

    # then: all four end FAILED OPTED_OUT with a dead letter, and none reaches Evolution
    wait_until(lambda: Message.objects.filter(pk__in=ids, status=Status.FAILED).count() == 4,
               timeout=60, message="all four failed")
    assert statuses(list(Message.objects.filter(pk__in=ids))) == [(Status.FAILED, FailureReason.OPTED_OUT)] * 4
    assert DeadLetter.objects.filter(message_id__in=ids, reason=FailureReason.OPTED_OUT, status="OPEN").count() == 4
    assert sends_ok(simulator, alice_instance.name) == []
    answer = requests.post(f"{stack.web_url}/v1/dead-letters/{DeadLetter.objects.filter(message_id=ids[0]).get().pk}/resend",
                           headers={"Authorization": f"Bearer {alice.live_key}"}, json={}, timeout=30)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "opted_out"
