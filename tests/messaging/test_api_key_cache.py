"""API keys are cached per process for a few seconds (issue 7, B1), never when unknown or revoked;
a send checks its key again in the funnel's read."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from messaging.api import authentication
from messaging.models import ApiKey, Message


@pytest.fixture(autouse=True)
def _fresh_key_cache():
    authentication.forget_keys()
    yield
    authentication.forget_keys()


def _get(actor):
    return actor.client().get("/v1/messages").status_code


def test_a_key_is_read_once_per_cache_period(alice):
    assert _get(alice) == 200
    with CaptureQueriesContext(connection) as queries:
        assert _get(alice) == 200
    assert not any("messaging_apikey" in q["sql"] for q in queries)


def test_a_revoked_key_stops_working_when_its_cache_entry_expires(alice, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(authentication.time, "monotonic", lambda: clock[0])
    assert _get(alice) == 200
    ApiKey.objects.get(project=alice.project, environment="LIVE").revoke()

    clock[0] += authentication.KEY_CACHE_SECONDS - 0.5
    assert _get(alice) == 200  # the documented trade-off: at most KEY_CACHE_SECONDS late
    clock[0] += 1
    assert _get(alice) == 401
    clock[0] += 60
    assert _get(alice) == 401  # revoked keys are never cached


def test_forgetting_the_keys_applies_a_revocation_at_once(alice):
    assert _get(alice) == 200
    ApiKey.objects.get(project=alice.project, environment="LIVE").revoke()
    authentication.forget_keys()
    assert _get(alice) == 401


def test_the_cache_can_be_turned_off(alice, settings):
    settings.API_KEY_CACHE_SECONDS = 0
    assert _get(alice) == 200
    ApiKey.objects.get(project=alice.project, environment="LIVE").revoke()
    assert _get(alice) == 401


def _send(actor):
    return actor.client().post(
        "/v1/messages/send", {"to": "+5511988887777", "category": "OTP", "text": "Code {{c}}", "variables": {"c": "1"}},
        format="json",
    )


def test_a_send_refuses_a_key_revoked_by_another_process_at_once(alice, alice_instance):
    assert _get(alice) == 200  # cached in this process
    before = Message.objects.count()
    # Revoked elsewhere (another web worker, the revoke_key command): this process's cache still has it.
    ApiKey.objects.filter(project=alice.project, environment="LIVE").update(revoked_at=timezone.now())

    response = _send(alice)

    assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "unauthorized"
    assert Message.objects.count() == before  # nothing stored
    assert _get(alice) == 200  # reads keep the documented few seconds of cache


@pytest.mark.parametrize("body", [{"to": "+5511988887777"}, "not json"])
def test_a_refused_body_with_a_key_revoked_by_another_process_answers_401_first(alice, body):
    assert _get(alice) == 200  # cached in this process
    ApiKey.objects.filter(project=alice.project, environment="LIVE").update(revoked_at=timezone.now())

    if isinstance(body, str):
        response = alice.client().post("/v1/messages/send", body, content_type="application/json")
    else:
        response = alice.client().post("/v1/messages/send", body, format="json")

    assert response.status_code == 401, response.content
    assert response.json()["error"]["code"] == "unauthorized"
