"""messaging.resend: force resend and dismiss, the way the API, dashboard, admin and bulk jobs use them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from messaging import lifecycle, opt_ins, resend
from messaging.accept import SendRequest, accept_message
from messaging.errors import Rejected
from messaging.models import DeadLetter, EventKind, FailureReason, Message, OutboxEntry, Status

RECIPIENT = "+5511988887777"


def failed_message(actor, reason=FailureReason.INVALID_RECIPIENT, category="UTILITY", to=RECIPIENT) -> DeadLetter:
    """A message accepted for `actor`, tried 3 times, then FAILED with a dead letter."""
    body = accept_message(actor.project, None, "LIVE", SendRequest(to=to, category=category, template="Hi"))
    message = Message.objects.get(pk=body["id"])
    Message.objects.filter(pk=message.pk).update(attempts=3, evolution_message_id=f"OLD-{message.pk}", sent_at=timezone.now())
    OutboxEntry.objects.filter(message=message).delete()
    assert lifecycle.fail(message, reason, "number is not on WhatsApp", {"status": 400}, from_statuses=(Status.QUEUED,))
    return DeadLetter.objects.get(message=message)


@pytest.fixture
def opted_in(alice):
    opt_ins.record(alice.project, RECIPIENT, "checkout")


def test_it_puts_the_same_message_back_to_queued_with_a_fresh_budget(alice, alice_instance, opted_in, settings):
    settings.SEND_MAX_ATTEMPTS = 7
    entry = failed_message(alice)
    before = timezone.now()

    done = resend.force_resend(entry, "dashboard:bob")

    assert done.outcome == resend.RESENT
    message = Message.objects.get(pk=entry.message_id)
    assert message.status == Status.QUEUED
    assert message.attempts == 0 and message.max_attempts == 7
    assert message.failure_reason == "" and message.failure_detail == "" and message.failed_at is None
    assert message.evolution_message_id == "" and message.sent_at is None
    # UTILITY's default lifetime, counted from the resend
    assert before + timedelta(hours=1) <= message.deliver_until <= timezone.now() + timedelta(hours=1)
    assert OutboxEntry.objects.filter(message=message, lane="utility").count() == 1


def test_it_records_who_resent_in_the_timeline_and_on_the_dead_letter(alice, alice_instance, opted_in):
    entry = failed_message(alice)

    resend.force_resend(entry, "dashboard:bob")

    entry.refresh_from_db()
    assert entry.status == "RESENT"
    assert entry.resolved_by == "dashboard:bob" and entry.resolved_at is not None
    event = Message.objects.get(pk=entry.message_id).events.get(kind=EventKind.RESENT)
    assert event.actor == "dashboard:bob"
    assert event.detail["previousReason"] == "INVALID_RECIPIENT"
    assert event.detail["deadLetter"] == entry.pk


def test_it_uses_a_given_deliver_until(alice, alice_instance, opted_in):
    entry = failed_message(alice)
    until = timezone.now() + timedelta(minutes=20)

    resend.force_resend(entry, "api:ps_live_x", deliver_until=until)

    assert Message.objects.get(pk=entry.message_id).deliver_until == until


def test_it_refuses_a_deliver_until_in_the_past_and_changes_nothing(alice, alice_instance, opted_in):
    entry = failed_message(alice)

    with pytest.raises(Rejected) as refused:
        resend.force_resend(entry, "bob", deliver_until=timezone.now() - timedelta(minutes=1))

    assert refused.value.status == 400
    assert Message.objects.get(pk=entry.message_id).status == Status.FAILED


def test_it_refuses_when_the_opt_in_was_revoked_since_and_changes_nothing(alice, alice_instance, opted_in):
    entry = failed_message(alice)
    opt_ins.revoke(alice.project, RECIPIENT, None)

    with pytest.raises(Rejected) as refused:
        resend.force_resend(entry, "dashboard:bob")

    assert refused.value.code == "opt_in_required" and refused.value.status == 422
    entry.refresh_from_db()
    assert entry.status == "OPEN" and entry.resolved_by == ""
    message = Message.objects.get(pk=entry.message_id)
    assert message.status == Status.FAILED and message.failure_reason == "INVALID_RECIPIENT"
    assert not message.events.filter(kind=EventKind.RESENT).exists()
    assert not OutboxEntry.objects.filter(message=message).exists()


def test_resending_twice_is_harmless(alice, alice_instance, opted_in):
    entry = failed_message(alice)

    first = resend.force_resend(entry, "dashboard:bob")
    second = resend.force_resend(entry, "dashboard:bob")

    assert (first.outcome, second.outcome) == (resend.RESENT, resend.ALREADY_RESENT)
    message = Message.objects.get(pk=entry.message_id)
    assert message.events.filter(kind=EventKind.RESENT).count() == 1
    assert OutboxEntry.objects.filter(message=message).count() == 1


def test_a_resent_message_that_fails_again_reopens_its_dead_letter(alice, alice_instance, opted_in):
    entry = failed_message(alice)
    resend.force_resend(entry, "dashboard:bob")
    message = Message.objects.get(pk=entry.message_id)

    lifecycle.fail(message, FailureReason.INSTANCE_NOT_FOUND, "instance deleted", from_statuses=(Status.QUEUED,))

    entry.refresh_from_db()
    assert entry.status == "OPEN" and entry.reason == "INSTANCE_NOT_FOUND"
    assert resend.force_resend(entry, "dashboard:bob").outcome == resend.RESENT


def test_dismiss_closes_the_entry_and_keeps_the_message_failed(alice, alice_instance, opted_in):
    entry = failed_message(alice)

    done = resend.dismiss(entry, "dashboard:bob")
    again = resend.dismiss(entry, "dashboard:bob")

    assert (done.outcome, again.outcome) == (resend.DISMISSED, resend.ALREADY_DISMISSED)
    entry.refresh_from_db()
    assert entry.status == "DISMISSED" and entry.resolved_by == "dashboard:bob"
    message = Message.objects.get(pk=entry.message_id)
    assert message.status == Status.FAILED
    assert list(message.events.filter(kind=EventKind.DISMISSED).values_list("actor", flat=True)) == ["dashboard:bob"]


def test_a_dismissed_entry_cannot_be_resent_and_a_resent_one_cannot_be_dismissed(alice, alice_instance, opted_in):
    dismissed = failed_message(alice)
    resend.dismiss(dismissed, "bob")
    resent = failed_message(alice, to=RECIPIENT)
    resend.force_resend(resent, "bob")

    with pytest.raises(Rejected) as first:
        resend.force_resend(dismissed, "bob")
    with pytest.raises(Rejected) as second:
        resend.dismiss(resent, "bob")

    assert first.value.code == second.value.code == "dead_letter_resolved"
    assert first.value.status == 409


def test_resend_each_counts_resent_refused_and_skipped(alice, alice_instance, opted_in):
    good = failed_message(alice)
    already = failed_message(alice)
    resend.force_resend(already, "bob")
    opt_ins.record(alice.project, "+5511977776666", "checkout")
    refused = failed_message(alice, to="+5511977776666")
    opt_ins.revoke(alice.project, "+5511977776666", None)  # consent withdrawn since the failure

    tally = resend.resend_each([good, already, refused], "bob")

    assert (tally.resent, tally.skipped, tally.refused) == (1, 1, 1)
    assert tally.last_id == max(good.pk, already.pk, refused.pk)


def test_matching_filters_by_reason_category_recipient_and_date(alice, alice_instance, carol, opted_in):
    invalid = failed_message(alice)
    gone = failed_message(alice, reason=FailureReason.INSTANCE_NOT_FOUND)
    DeadLetter.objects.filter(pk=gone.pk).update(created_at=timezone.now() - timedelta(days=2))

    assert list(resend.matching(alice.project, "LIVE", {"reason": "INVALID_RECIPIENT"})) == [invalid]
    assert set(resend.matching(alice.project, "LIVE", {"category": "UTILITY", "to": RECIPIENT})) == {invalid, gone}
    assert list(resend.matching(alice.project, "LIVE", {"created_after": timezone.now() - timedelta(days=1)})) == [invalid]
    assert list(resend.matching(carol.project, "LIVE", {})) == []
