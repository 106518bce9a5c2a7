"""POST /v1/messages/send: the whole funnel, and a rejected request stores nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from messaging import opt_ins
from messaging.models import ApiKey, IdempotencyRecord, Message, MessageEvent, OutboxEntry
from tests.conftest import add_instance

URL = "/v1/messages/send"
RECIPIENT = "+5511988887777"


def body(**overrides):
    data = {"to": RECIPIENT, "category": "UTILITY", "text": "Hello {{name}}", "variables": {"name": "Ana"}}
    data.update(overrides)
    return data


def assert_nothing_stored():
    assert Message.objects.count() == 0
    assert OutboxEntry.objects.count() == 0
    assert MessageEvent.objects.count() == 0


def assert_error(response, status, code):
    assert response.status_code == status, response.content
    payload = response.json()
    assert payload["error"]["code"] == code
    assert payload["error"]["message"]
    assert isinstance(payload["error"]["details"], dict)


@pytest.fixture
def opted_in(alice):
    opt_ins.record(alice.project, RECIPIENT, "checkout")


def test_it_accepts_and_writes_message_event_and_outbox_in_one_go(alice, alice_instance, opted_in):
    response = alice.client().post(URL, body(), format="json")

    assert response.status_code == 202, response.content
    data = response.json()
    assert data["status"] == "QUEUED"
    assert data["instance"] == "alice-main"
    assert data["category"] == "UTILITY"
    message = Message.objects.get(pk=data["id"])
    assert message.text == "Hello Ana"
    assert list(message.events.values_list("kind", flat=True)) == ["ACCEPTED"]
    assert OutboxEntry.objects.filter(message=message, lane="utility").count() == 1


@pytest.mark.parametrize(
    "category, minutes", [("OTP", 2), ("UTILITY", 60), ("MARKETING", 240)]
)
def test_deliver_until_defaults_by_category(alice, alice_instance, opted_in, category, minutes):
    before = timezone.now()
    response = alice.client().post(URL, body(category=category), format="json")
    after = timezone.now()
    assert response.status_code == 202, response.content
    deliver_until = parse_datetime(response.json()["deliverUntil"])
    # the default counts from the accept, which happened between the two readings of the clock
    # (the answer's timestamp has millisecond precision)
    precision = timedelta(milliseconds=1)
    assert before - precision <= deliver_until - timedelta(minutes=minutes) <= after + precision


def test_a_deliver_until_in_the_past_is_refused(alice, alice_instance, opted_in):
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    response = alice.client().post(URL, body(deliverUntil=past), format="json")
    assert_error(response, 400, "invalid_request")
    assert "deliverUntil" in response.json()["error"]["details"]["fields"]
    assert_nothing_stored()


def test_missing_key_is_401(db):
    from rest_framework.test import APIClient

    response = APIClient().post(URL, body(), format="json")
    assert_error(response, 401, "unauthorized")
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("header", ["Bearer nope", "Token ps_live_x", "Bearer ps_live_unknown"])
def test_bad_keys_are_401(db, header):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert_error(client.post(URL, body(), format="json"), 401, "unauthorized")


def test_the_key_answers_before_the_accept_header(alice):
    from rest_framework.test import APIClient

    response = APIClient().post(URL, body(), format="json", HTTP_ACCEPT="text/html")
    assert_error(response, 401, "unauthorized")  # not 406: the key is checked first (docs/api.md)
    assert response["Content-Type"].startswith("application/json")
    assert_error(alice.client().post(URL, body(), format="json", HTTP_ACCEPT="text/html"), 406, "not_acceptable")


@pytest.mark.parametrize("scheme", ["bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(alice, alice_instance, opted_in, scheme):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {alice.live_key}")
    assert client.post(URL, body(), format="json").status_code == 202


def test_an_explicit_null_for_an_optional_field_means_not_given(alice, alice_instance, opted_in):
    response = alice.client().post(
        URL, body(text="Hello", variables=None, priority=None, metadata=None, instance=None, deliverUntil=None),
        format="json",
    )
    assert response.status_code == 202, response.content
    message = Message.objects.get(pk=response.json()["id"])
    assert (message.variables, message.priority, message.metadata) == ({}, "normal", {})


def test_a_null_required_field_is_still_400(alice, alice_instance, opted_in):
    assert_error(alice.client().post(URL, body(category=None), format="json"), 400, "invalid_request")
    assert_nothing_stored()


def test_a_revoked_key_is_401(alice, alice_instance, opted_in):
    ApiKey.objects.get(project=alice.project, environment="LIVE").revoke()
    assert_error(alice.client().post(URL, body(), format="json"), 401, "unauthorized")
    assert_nothing_stored()


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"to": "12345"}, "to"),
        ({"to": "+55 11 0000"}, "to"),
        ({"category": "SPAM"}, "category"),
        ({"text": "   "}, "text"),
        ({"priority": "high"}, "priority"),
        ({"variables": {}}, "variables"),
        ({"surprise": 1}, "surprise"),
        ({"metadata": "x"}, "metadata"),
    ],
)
def test_bad_payloads_are_400_naming_the_field(alice, alice_instance, opted_in, overrides, field):
    response = alice.client().post(URL, body(**overrides), format="json")
    assert_error(response, 400, "invalid_request")
    assert field in response.json()["error"]["details"]["fields"]
    assert_nothing_stored()


def test_malformed_json_is_400(alice, alice_instance):
    response = alice.client().post(URL, data='{"to": ', content_type="application/json")
    assert_error(response, 400, "invalid_json")
    assert_nothing_stored()


def test_wrong_content_type_is_415(alice, alice_instance):
    response = alice.client().post(URL, data="to=1", content_type="application/x-www-form-urlencoded")
    assert_error(response, 415, "unsupported_media_type")
    assert_nothing_stored()


def test_get_on_send_is_405_json(alice):
    assert_error(alice.client().get(URL), 405, "method_not_allowed")


def test_test_keys_only_send_to_the_test_number(alice, alice_instance, opted_in):
    response = alice.client(live=False).post(URL, body(), format="json")
    assert_error(response, 403, "test_recipient_not_allowed")
    assert_nothing_stored()
    opt_ins.record(alice.project, alice.project.test_number, "dev", environment="TEST")
    ok = alice.client(live=False).post(URL, body(to=alice.project.test_number), format="json")
    assert ok.status_code == 202


def test_live_keys_need_production_approval(alice, alice_instance, opted_in):
    alice.project.production_approved = False
    alice.project.save()
    assert_error(alice.client().post(URL, body(), format="json"), 403, "production_not_approved")
    assert_nothing_stored()


def test_an_explicit_instance_must_be_the_projects(alice, alice_instance, opted_in, carol):
    add_instance(carol.project, "carol-main")
    response = alice.client().post(URL, body(instance="carol-main"), format="json")
    assert_error(response, 422, "unknown_instance")
    assert_nothing_stored()


def test_marketing_needs_an_own_instance(alice, official_instance, opted_in):
    response = alice.client().post(URL, body(category="MARKETING"), format="json")
    assert_error(response, 422, "own_instance_required")
    assert_nothing_stored()


def test_sends_need_a_live_opt_in(alice, alice_instance):
    assert_error(alice.client().post(URL, body(), format="json"), 422, "opt_in_required")
    assert_nothing_stored()


def test_a_revoked_opt_in_no_longer_counts(alice, alice_instance, opted_in):
    opt_ins.revoke(alice.project, RECIPIENT)
    assert_error(alice.client().post(URL, body(), format="json"), 422, "opt_in_required")


def test_an_otp_through_the_official_number_needs_no_opt_in(alice, alice_instance, official_instance):
    response = alice.client().post(URL, body(category="OTP", text="Code {{c}}", variables={"c": "1"}), format="json")
    assert response.status_code == 202, response.content
    assert response.json()["instance"] == "pilot-official"


def test_the_projects_own_open_instance_is_preferred(alice, alice_instance, official_instance, opted_in):
    response = alice.client().post(URL, body(), format="json")
    assert response.json()["instance"] == "alice-main"


def test_the_pilot_status_default_is_used_without_an_own_open_instance(alice, official_instance, opted_in):
    response = alice.client().post(URL, body(), format="json")
    assert response.status_code == 202
    assert response.json()["instance"] == "pilot-official"


def test_checks_run_in_the_contracts_order(alice, alice_instance):
    # bad payload AND test recipient AND no opt-in: the payload error answers first
    response = alice.client(live=False).post(URL, body(to="nope"), format="json")
    assert_error(response, 400, "invalid_request")
    # valid payload, TEST key to a foreign number, no opt-in: the environment answers first
    assert_error(alice.client(live=False).post(URL, body(), format="json"), 403, "test_recipient_not_allowed")


def test_the_same_idempotency_key_and_body_replays_the_first_answer(alice, alice_instance, opted_in):
    client = alice.client()
    first = client.post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    second = client.post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    assert first.status_code == second.status_code == 202
    assert first.json() == second.json()
    assert second["Idempotent-Replayed"] == "true"
    assert Message.objects.count() == 1


def test_the_same_idempotency_key_with_another_body_is_409(alice, alice_instance, opted_in):
    client = alice.client()
    client.post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY="order-2")
    response = client.post(URL, body(text="Other"), format="json", HTTP_IDEMPOTENCY_KEY="order-2")
    assert_error(response, 409, "idempotency_conflict")
    assert Message.objects.count() == 1


def test_idempotency_keys_are_per_project(alice, alice_instance, opted_in, carol):
    add_instance(carol.project, "carol-main")
    opt_ins.record(carol.project, RECIPIENT, "x")
    alice.client().post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY="k")
    response = carol.client().post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 202
    assert Message.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 2


def test_the_rate_limit_answers_429_with_retry_after(alice, alice_instance, opted_in, settings):
    settings.RATE_LIMIT_PER_SECOND = 1
    settings.RATE_LIMIT_BURST = 3
    client = alice.client()
    statuses = [client.post(URL, body(), format="json").status_code for _ in range(5)]
    assert statuses[:3] == [202, 202, 202]
    limited = client.post(URL, body(), format="json")
    assert_error(limited, 429, "rate_limited")
    assert int(limited["Retry-After"]) >= 1
    assert Message.objects.count() == 3


def test_metadata_is_kept_and_returned(alice, alice_instance, opted_in):
    response = alice.client().post(URL, body(metadata={"order": 42, "tags": ["a"]}), format="json")
    message_id = response.json()["id"]
    detail = alice.client().get(f"/v1/messages/{message_id}").json()
    assert detail["metadata"] == {"order": 42, "tags": ["a"]}


def test_the_202_is_what_drf_would_render_with_the_same_headers(alice, alice_instance, opted_in):
    # The 202 skips DRF's Response (views.accepted_response); its bytes and headers must not differ.
    from rest_framework.renderers import JSONRenderer

    response = alice.client().post(URL, body(to="+55 11 98888-7777", variables={"name": "Zoë ☕"}), format="json")

    assert response.status_code == 202, response.content
    assert response.content == JSONRenderer().render(response.json())
    assert response["Content-Type"] == "application/json"
    assert response["Allow"] == "POST, OPTIONS"
    first = alice.client().post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY="k-202")
    replayed = alice.client().post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY="k-202")  # a DRF Response
    assert replayed["Idempotent-Replayed"] == "true"
    assert (replayed.status_code, replayed.json()) == (202, first.json())
    assert set(replayed.headers) - {"Idempotent-Replayed"} == set(first.headers)
