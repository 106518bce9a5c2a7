"""GET /v1/dead-letters, POST /v1/dead-letters/{id}/resend and /dismiss."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from messaging import opt_ins
from messaging.models import DeadLetter, EventKind, FailureReason, Message, Status
from tests.messaging.test_resend import RECIPIENT, failed_message

LIST = "/v1/dead-letters"


def resend_url(entry: DeadLetter) -> str:
    return f"/v1/dead-letters/{entry.pk}/resend"


def dismiss_url(entry: DeadLetter) -> str:
    return f"/v1/dead-letters/{entry.pk}/dismiss"


def assert_error(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and isinstance(error["details"], dict)


@pytest.fixture
def opted_in(alice):
    opt_ins.record(alice.project, RECIPIENT, "checkout")


@pytest.fixture
def entry(alice, alice_instance, opted_in) -> DeadLetter:
    return failed_message(alice)


# ---- list -----------------------------------------------------------------------------------

def test_it_lists_the_projects_dead_letters_newest_first(alice, entry):
    older = failed_message(alice, reason=FailureReason.INSTANCE_NOT_FOUND)
    DeadLetter.objects.filter(pk=older.pk).update(created_at=timezone.now() - timedelta(hours=1))

    response = alice.client().get(LIST)

    assert response.status_code == 200, response.content
    data = response.json()["data"]
    assert [d["id"] for d in data] == [entry.pk, older.pk]
    first = data[0]
    assert first["messageId"] == str(entry.message_id)
    assert first["reason"] == "INVALID_RECIPIENT" and first["status"] == "OPEN"
    assert first["attempts"] == 3 and first["lastGatewayResponse"] == {"status": 400}
    assert first["category"] == "UTILITY" and first["to"] == RECIPIENT
    assert response.json()["nextCursor"] is None


def test_it_filters_and_paginates_with_a_cursor(alice, entry):
    second = failed_message(alice)
    third = failed_message(alice, reason=FailureReason.RETRIES_EXHAUSTED)

    page = alice.client().get(LIST, {"reason": "INVALID_RECIPIENT", "limit": 1}).json()
    assert [d["id"] for d in page["data"]] == [second.pk]
    rest = alice.client().get(LIST, {"reason": "INVALID_RECIPIENT", "limit": 1, "cursor": page["nextCursor"]}).json()
    assert [d["id"] for d in rest["data"]] == [entry.pk] and rest["nextCursor"] is None

    by_status = alice.client().get(LIST, {"status": "OPEN", "category": "UTILITY", "to": RECIPIENT}).json()
    assert {d["id"] for d in by_status["data"]} == {entry.pk, second.pk, third.pk}
    future = (timezone.now() + timedelta(minutes=1)).isoformat()
    assert alice.client().get(LIST, {"createdAfter": future}).json()["data"] == []


@pytest.mark.parametrize("query, field", [({"status": "LOST"}, "status"), ({"to": "12"}, "to"),
                                          ({"cursor": "!!"}, "cursor"), ({"colour": "red"}, "colour")])
def test_bad_filters_are_400_naming_the_field(alice, entry, query, field):
    response = alice.client().get(LIST, query)
    assert_error(response, 400, "invalid_request")
    assert field in response.json()["error"]["details"]["fields"]


def test_another_project_sees_none_of_them(carol, entry):
    assert carol.client().get(LIST).json()["data"] == []


# ---- resend -------------------------------------------------------------------------------

def test_resend_queues_the_same_message_and_says_who(alice, entry):
    response = alice.client().post(resend_url(entry), format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "RESENT" and body["outcome"] == "resent"
    assert body["resolvedBy"].startswith("api:ps_live_")
    assert body["message"]["id"] == str(entry.message_id) and body["message"]["status"] == "QUEUED"
    assert body["message"]["attempts"] == 0
    event = Message.objects.get(pk=entry.message_id).events.get(kind=EventKind.RESENT)
    assert event.actor == body["resolvedBy"]


def test_resend_takes_a_deliver_until(alice, entry):
    until = (timezone.now() + timedelta(minutes=30)).replace(microsecond=0)
    response = alice.client().post(resend_url(entry), {"deliverUntil": until.isoformat()}, format="json")
    assert response.status_code == 200, response.content
    assert Message.objects.get(pk=entry.message_id).deliver_until == until


def test_resending_twice_answers_200_and_changes_nothing_more(alice, entry):
    alice.client().post(resend_url(entry), format="json")
    response = alice.client().post(resend_url(entry), format="json")
    assert response.status_code == 200
    assert response.json()["outcome"] == "already_resent"
    assert Message.objects.get(pk=entry.message_id).events.filter(kind=EventKind.RESENT).count() == 1


def test_resend_is_refused_with_the_funnels_reason_when_opt_in_was_revoked(alice, entry):
    opt_ins.revoke(alice.project, RECIPIENT, None)

    response = alice.client().post(resend_url(entry), format="json")

    assert_error(response, 422, "opt_in_required")
    assert Message.objects.get(pk=entry.message_id).status == Status.FAILED
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


def test_resend_of_a_dismissed_entry_is_409(alice, entry):
    alice.client().post(dismiss_url(entry), format="json")
    assert_error(alice.client().post(resend_url(entry), format="json"), 409, "dead_letter_resolved")


def test_resend_with_a_past_deliver_until_is_400(alice, entry):
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    response = alice.client().post(resend_url(entry), {"deliverUntil": past}, format="json")
    assert_error(response, 400, "invalid_request")
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


# ---- dismiss ------------------------------------------------------------------------------

def test_dismiss_closes_the_entry(alice, entry):
    response = alice.client().post(dismiss_url(entry), format="json")

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "DISMISSED" and response.json()["outcome"] == "dismissed"
    assert response.json()["message"]["status"] == "FAILED"
    assert alice.client().post(dismiss_url(entry), format="json").json()["outcome"] == "already_dismissed"


# ---- the edges every endpoint has ---------------------------------------------------------

@pytest.mark.parametrize("method, url", [("get", "list"), ("post", "resend"), ("post", "dismiss")])
def test_without_a_key_it_is_401(entry, method, url):
    target = {"list": LIST, "resend": resend_url(entry), "dismiss": dismiss_url(entry)}[url]
    assert_error(getattr(APIClient(), method)(target, format="json"), 401, "unauthorized")
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


@pytest.mark.parametrize("action", ["resend", "dismiss"])
def test_another_projects_entry_is_404_and_unchanged(carol, entry, action):
    url = resend_url(entry) if action == "resend" else dismiss_url(entry)
    assert_error(carol.client().post(url, format="json"), 404, "not_found")
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


def test_an_unknown_entry_is_404(alice, entry):
    assert_error(alice.client().post("/v1/dead-letters/999999/resend", format="json"), 404, "not_found")


@pytest.mark.parametrize("method, url", [("post", "list"), ("get", "resend"), ("delete", "dismiss")])
def test_a_wrong_method_is_405(alice, entry, method, url):
    target = {"list": LIST, "resend": resend_url(entry), "dismiss": dismiss_url(entry)}[url]
    assert_error(getattr(alice.client(), method)(target), 405, "method_not_allowed")


@pytest.mark.parametrize("action", ["resend", "dismiss"])
def test_bad_json_is_400_and_changes_nothing(alice, entry, action):
    url = resend_url(entry) if action == "resend" else dismiss_url(entry)
    response = alice.client().post(url, data="{not json", content_type="application/json")
    assert_error(response, 400, "invalid_json")
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


@pytest.mark.parametrize("action", ["resend", "dismiss"])
def test_unknown_fields_are_400(alice, entry, action):
    url = resend_url(entry) if action == "resend" else dismiss_url(entry)
    response = alice.client().post(url, {"force": True}, format="json")
    assert_error(response, 400, "invalid_request")
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


@pytest.mark.parametrize("action", ["list", "resend"])
def test_too_many_requests_is_429_with_retry_after(alice, entry, settings, action):
    settings.RATE_LIMIT_BURST = 2
    settings.RATE_LIMIT_PER_SECOND = 0.01
    client = alice.client()
    call = (lambda: client.get(LIST)) if action == "list" else (lambda: client.post(resend_url(entry), format="json"))
    answers = [call() for _ in range(3)]
    assert [a.status_code for a in answers[:2]] == [200, 200]
    assert_error(answers[2], 429, "rate_limited")
    assert int(answers[2]["Retry-After"]) >= 1
