"""Hostile input on Evolution's webhook and the internal forward (issue 21): never a 5xx, always the JSON
error envelope, 401 for whoever is not authenticated before anything about the body, nothing stored."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from ingestion import auth
from ingestion.models import IngestionEvent
from messaging.models import Status
from tests.ingestion.helpers import URL, make_message, receipt, sample, token_header

DEEP = 5_000  # far past any recursion limit, yet only 10 KB on the wire


def deep_array(levels: int = DEEP) -> str:
    return "[" * levels + "]" * levels


def raw_post(body: bytes | str, path: str = URL, **headers: Any) -> Any:
    return Client().post(path, data=body, content_type="application/json", **headers)


def secret_header(settings: Any) -> dict[str, str]:
    return {"HTTP_X_INTERNAL_WEBHOOK_SECRET": settings.INTERNAL_WEBHOOK_SECRET}


def assert_envelope(response: Any, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.content[:300]
    body = response.json()
    assert set(body) == {"error"} and {"code", "message", "details"} <= set(body["error"])
    if code is not None:
        assert body["error"]["code"] == code


@pytest.fixture
def sent_message(alice, alice_instance):
    return make_message(alice.project, alice_instance)


# ---- bodies that are not JSON we take --------------------------------------------------------------

HOSTILE_BODIES = {
    "deep_array": deep_array(),
    "deep_in_data": '{"event": "messages.update", "instance": "alice-main", "data": ' + deep_array() + "}",
    "deep_object": '{"a": ' * DEEP + "1" + "}" * DEEP,
    "huge_number": '{"event": "messages.update", "instance": "alice-main", "data": {"n": 1' + "0" * 5000 + "}}",
    "nan": '{"event": "messages.update", "instance": "alice-main", "data": {"n": NaN}}',
    "truncated_utf8": b'{"event": "messages.update", "instance": "alice-main", "data": {"t": "\xe2\x82"}}',
    "latin1": b'{"event": "messages.update", "instance": "alice-m\xe9in", "data": {}}',
    "empty": b"",
}


@pytest.mark.parametrize("name", HOSTILE_BODIES)
def test_a_hostile_body_from_a_stranger_is_401(alice_instance, name):
    # Even with alice's valid token: nothing readable names alice-main.
    for headers in ({}, token_header(alice_instance)):
        assert_envelope(raw_post(HOSTILE_BODIES[name], **headers), 401, "unauthorized")
    assert IngestionEvent.objects.count() == 0


@pytest.mark.parametrize("name", HOSTILE_BODIES)
def test_a_hostile_body_from_our_own_processes_is_400(alice_instance, settings, name):
    response = raw_post(HOSTILE_BODIES[name], **secret_header(settings))
    assert_envelope(response, 400, "invalid_json")
    assert IngestionEvent.objects.count() == 0


@pytest.mark.parametrize("path", [URL, f"{URL}/messages-update"])
def test_deep_nesting_is_refused_on_both_webhook_forms_and_the_forward(alice_instance, settings, path):
    forward = '{"already_saved": true, "event": "messages.update", "instance": "alice-main", "data": ' + deep_array() + "}"
    assert_envelope(raw_post(forward, path), 401, "unauthorized")
    assert_envelope(raw_post(forward, path, **secret_header(settings)), 400, "invalid_json")


# ---- credentials that are not credentials -------------------------------------------------------------

@pytest.mark.parametrize(
    "headers",
    [
        {"HTTP_X_WEBHOOK_TOKEN": "tökén-ñ"},  # non-ASCII (latin-1 on the wire)
        {"HTTP_X_WEBHOOK_TOKEN": "\u20ac" * 10},
        {"HTTP_X_WEBHOOK_TOKEN": "a\x00b"},
        {"HTTP_X_WEBHOOK_TOKEN": "x" * 20_000},
        {"HTTP_AUTHORIZATION": "Bearer ünïcode.ünïcode.ünïcode"},
        {"HTTP_AUTHORIZATION": "Bearer " + "a" * 20_000},
        {"HTTP_AUTHORIZATION": "Bearer " + "eyJ" * 3000 + ".e30.x"},
        {"HTTP_AUTHORIZATION": "Bearer"},
        {"HTTP_AUTHORIZATION": "Bearer \x00"},
    ],
)
def test_a_malformed_credential_header_is_401_and_changes_nothing(sent_message, headers):
    assert_envelope(raw_post(json.dumps(receipt("DELIVERY_ACK")), **headers), 401, "unauthorized")
    assert IngestionEvent.objects.count() == 0
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


@pytest.mark.parametrize(
    "apikey",
    ["\ud800", "TOKEN-ALICE-MAIN\ud800", "\udfff\ud800", "TOKEN\x00", "é" * 10, "x" * 50_000, 7, 1.5, True, None,
     [], ["TOKEN-ALICE-MAIN"], {"k": "TOKEN-ALICE-MAIN"}, ""],
)
def test_a_malformed_body_apikey_is_401_and_changes_nothing(sent_message, apikey):
    payload = receipt("DELIVERY_ACK")
    payload["apikey"] = apikey
    body = json.dumps(payload)  # ensure_ascii: a lone surrogate goes as "\ud800", as an attacker sends it
    assert_envelope(raw_post(body), 401, "unauthorized")
    assert IngestionEvent.objects.count() == 0
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


@pytest.mark.parametrize("given", ["sécret", "\u20ac" * 40, "x" * 20_000, "", "a\x00"])
def test_a_malformed_internal_secret_is_401_on_the_forward_and_the_metrics(sent_message, given):
    forwarded = dict(receipt("READ"), already_saved=True)
    headers = {"HTTP_X_INTERNAL_WEBHOOK_SECRET": given}
    assert_envelope(raw_post(json.dumps(forwarded), **headers), 401, "unauthorized")
    assert_envelope(Client().get("/api/internal/metrics", **headers), 401, "unauthorized")
    assert Client().get("/api/internal/metrics/prometheus", **headers).status_code == 401
    assert IngestionEvent.objects.count() == 0


# ---- wrong types in every field of an event ---------------------------------------------------------

@pytest.mark.parametrize(
    "instance",
    [7, 1.5, True, None, [], ["alice-main"], {"name": "alice-main"}, "", "x" * 60_000, "alice-main\x00",
     "alice\ud800main", "alice-main" + " " * 200, "\x00"],
)
def test_an_instance_field_of_the_wrong_type_or_size_is_401(sent_message, alice_instance, instance):
    payload = receipt("DELIVERY_ACK")
    payload["instance"] = instance
    assert_envelope(raw_post(json.dumps(payload), **token_header(alice_instance)), 401, "unauthorized")
    assert IngestionEvent.objects.count() == 0


@pytest.mark.parametrize(
    "instance", [7, [], "", "x" * 60_000, "alice-main\x00", "alice\ud800main", "\x00"],
)
def test_an_instance_field_of_the_wrong_type_or_size_on_a_forward_is_400(sent_message, settings, instance):
    payload = dict(receipt("DELIVERY_ACK"), already_saved=True)
    payload["instance"] = instance
    response = raw_post(json.dumps(payload), **secret_header(settings))
    assert_envelope(response, 400, "not_an_evolution_event")
    assert IngestionEvent.objects.count() == 0


@pytest.mark.parametrize(
    "event", [7, None, [], {}, "", "x" * 65, "Messages.Update", "messages.update\x00", "messages\ud800update",
              "mëssages.update"],
)
def test_an_event_field_of_the_wrong_type_or_size_is_400_for_an_authenticated_instance(alice_instance, event):
    payload = receipt("DELIVERY_ACK")
    payload["event"] = event
    assert_envelope(raw_post(json.dumps(payload), **token_header(alice_instance)), 400, "not_an_evolution_event")
    assert IngestionEvent.objects.count() == 0


@pytest.mark.parametrize("data", [None, 7, "text", True])
def test_a_data_field_that_is_not_an_object_or_list_is_400(alice_instance, data):
    payload = receipt("DELIVERY_ACK")
    payload["data"] = data
    assert_envelope(raw_post(json.dumps(payload), **token_header(alice_instance)), 400, "not_an_evolution_event")


@pytest.mark.parametrize(
    "data",
    [[], [1, 2, 3], [{"keyId": "x"}], {"keyId": 7, "status": ["READ"], "fromMe": "yes"},
     {"keyId": None, "status": None}, {"key": "x", "status": 7}, {"keyId": "k" * 5_000, "status": "READ"},
     {"keyId": "3EB0\x00", "status": "READ"}, {"keyId": "\ud800", "status": "DELIVERY_ACK"},
     {"keyId": "3EB0C431C26A1916E07A4B", "status": "READ\x00"}, {"text": "\x00" * 1000}],
)
def test_a_receipt_with_data_of_the_wrong_shape_is_answered_not_5xx(sent_message, alice_instance, data):
    payload = receipt("DELIVERY_ACK")
    payload["data"] = data
    response = raw_post(json.dumps(payload), **token_header(alice_instance))
    assert response.status_code == 200, response.content[:300]
    assert response.json()["status"] in ("processed", "skipped")
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT  # none of these is a valid receipt for it


@pytest.mark.parametrize(
    "date_time",
    ["not a date", 12345, None, [], {}, "2025-13-45T99:99:99Z", "2025-10-21T11:35:39+99:00", "2025-10-21T11:35:39",
     "0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59", "2025-10-21T11:35:39.5123456789Z", "x" * 10_000,
     "2025-10-21\x00T11:35:39Z", "\ud800"],
)
def test_junk_date_times_never_break_a_connection_update(alice_instance, date_time):
    for state in ("connecting", "open"):
        payload = sample(f"webhook.connection.update.{state}.json")
        payload["date_time"] = date_time
        response = raw_post(json.dumps(payload), **token_header(alice_instance))
        assert response.status_code == 200, response.content[:300]
    alice_instance.refresh_from_db()
    assert alice_instance.connection_state == "open"


@pytest.mark.parametrize(
    "patch",
    [{"destination": 7}, {"sender": ["x"]}, {"server_url": {"a": 1}}, {"already_saved": "true"},
     {"already_saved": 1}, {"extra": "\x00\ud800"}, {"\x00key": "value"}, {"\ud800": 1}],
)
def test_junk_in_the_other_fields_is_stored_without_crashing(sent_message, alice_instance, patch):
    payload = dict(receipt("DELIVERY_ACK"), **patch)
    response = raw_post(json.dumps(payload), **token_header(alice_instance))
    assert response.status_code == 200, response.content[:300]
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED


def test_nul_and_lone_surrogates_in_content_are_stored_replaced(alice_instance):
    payload = sample("webhook.messages.upsert.inbound-text.json")
    payload["data"]["pushName"] = "a\x00b\ud800c"
    response = raw_post(json.dumps(payload), **token_header(alice_instance))
    assert response.status_code == 200
    stored = IngestionEvent.objects.get()
    assert stored.payload["data"]["pushName"] == "a\ufffdb\ufffdc"


def test_a_stranger_never_reaches_the_cache_with_a_name_too_long_for_an_instance(alice_instance):
    payload = receipt("DELIVERY_ACK", instance="n" * 60_000)
    assert raw_post(json.dumps(payload)).status_code == 401
    assert auth.cache_footprint() == (0, 0)


@pytest.mark.parametrize(
    "patch",
    [{"data": {"keyId": "3EB0\x00", "status": "READ\ud800"}}, {"data": [None, "\x00", {"\ud800": []}]},
     {"date_time": "\x00"}, {"event": "connection.update", "data": {"state": ["open"]}},
     {"event": "connection.update", "data": {"state": "open"}, "date_time": "0001-01-01T00:00:00+23:59"},
     {"destination": "\ud800", "sender": "\x00"}],
)
def test_a_forward_with_junk_in_its_fields_is_answered_not_5xx(sent_message, settings, patch):
    # Our own consumer forwards what Evolution published: the same junk can come this way, saved or not.
    forwarded = dict(receipt("DELIVERY_ACK"), already_saved=True, **patch)
    response = raw_post(json.dumps(forwarded), **secret_header(settings))
    assert response.status_code == 200, response.content[:300]
    assert IngestionEvent.objects.count() == 1
