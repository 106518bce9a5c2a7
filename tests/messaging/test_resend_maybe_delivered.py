"""Issue 22: a message that may have been delivered (OUTCOME_UNKNOWN) is resent only on explicit
confirmation, wherever the resend comes from (API, dashboard, bulk job, admin)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from dashboard import bulk
from dashboard.models import BulkResendJob
from messaging import opt_ins, resend
from messaging.errors import Rejected
from messaging.models import DeadLetter, EventKind, FailureReason, Message, Status
from tests.messaging.test_resend import RECIPIENT, failed_message


@pytest.fixture
def maybe_delivered(alice, alice_instance) -> DeadLetter:
    opt_ins.record(alice.project, RECIPIENT, "checkout")
    return failed_message(alice, reason=FailureReason.OUTCOME_UNKNOWN)


def still_failed(entry: DeadLetter) -> bool:
    entry.refresh_from_db()
    return entry.status == "OPEN" and Message.objects.get(pk=entry.message_id).status == Status.FAILED


def test_force_resend_refuses_without_the_confirmation(maybe_delivered):
    with pytest.raises(Rejected) as refused:
        resend.force_resend(maybe_delivered, "test")
    assert refused.value.status == 409 and refused.value.code == "confirmation_required"
    assert still_failed(maybe_delivered)

    done = resend.force_resend(maybe_delivered, "test", confirm_maybe_delivered=True)
    assert done.outcome == resend.RESENT
    message = Message.objects.get(pk=maybe_delivered.message_id)
    assert message.status == Status.QUEUED and not message.outcome_unknown
    assert message.events.get(kind=EventKind.RESENT).detail["confirmedMaybeDelivered"] is True


def test_the_api_answers_409_confirmation_required_then_resends_with_the_flag(alice, maybe_delivered):
    url = f"/v1/dead-letters/{maybe_delivered.pk}/resend"
    listed = alice.client().get("/v1/dead-letters").json()["data"][0]
    assert listed["reason"] == "OUTCOME_UNKNOWN" and listed["outcomeUnknown"] is True

    response = alice.client().post(url, {}, format="json")
    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "confirmation_required"
    assert still_failed(maybe_delivered)
    assert alice.client().post(url, {"confirmMaybeDelivered": False}, format="json").status_code == 409

    response = alice.client().post(url, {"confirmMaybeDelivered": True}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["outcome"] == "resent"


def test_an_ordinary_failure_needs_no_confirmation(alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "checkout")
    entry = failed_message(alice, reason=FailureReason.EXPIRED)
    response = alice.client().post(f"/v1/dead-letters/{entry.pk}/resend", {}, format="json")
    assert response.status_code == 200 and response.json()["outcome"] == "resent"


@pytest.fixture
def bob_browser(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


def test_the_dashboard_shows_it_and_needs_the_checkbox(bob_browser, alice, maybe_delivered):
    detail = f"/dashboard/p/{alice.project.pk}/dead-letters/{maybe_delivered.pk}/"
    page = bob_browser.get(detail).content
    assert b'id="outcome-unknown"' in page and b'name="confirm_maybe_delivered"' in page

    response = bob_browser.post(detail + "resend", follow=True)
    assert b"confirmation_required" in response.content and still_failed(maybe_delivered)

    bob_browser.post(detail + "resend", {"confirm_maybe_delivered": "1"})
    assert DeadLetter.objects.get(pk=maybe_delivered.pk).status == "RESENT"


def test_a_bulk_resend_refuses_messages_that_may_have_been_delivered(bob_browser, alice, maybe_delivered):
    ordinary = failed_message(alice)
    bob_browser.post(f"/dashboard/p/{alice.project.pk}/dead-letters/bulk-resend", {"scope": "all"})
    job = BulkResendJob.objects.get()
    bulk.run(job.pk)
    job.refresh_from_db()
    assert (job.resent, job.refused) == (1, 1)
    assert DeadLetter.objects.get(pk=ordinary.pk).status == "RESENT"
    assert still_failed(maybe_delivered)


def test_admin_refuses_it_in_the_plain_action_and_resends_in_the_confirming_one(db, maybe_delivered):
    user = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-123")
    ops = Client()
    ops.force_login(user)
    response = ops.post("/admin/messaging/deadletter/",
                        {"action": "force_resend", "_selected_action": [maybe_delivered.pk]}, follow=True)
    assert b"confirmation_required" in response.content and still_failed(maybe_delivered)

    response = ops.post("/admin/messaging/deadletter/",
                        {"action": "force_resend_maybe_delivered", "_selected_action": [maybe_delivered.pk]},
                        follow=True)
    assert b"1 resent" in response.content
    assert DeadLetter.objects.get(pk=maybe_delivered.pk).status == "RESENT"
