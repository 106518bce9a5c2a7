"""Every answer of the real Evolution API maps to the right outcome (bodies from tests/messaging/samples)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from messaging.models import FailureReason
from messaging.sending import gateway

SAMPLES = Path(__file__).resolve().parent / "samples"


def sample(name: str):
    return json.loads((SAMPLES / name).read_text())


@pytest.mark.parametrize(
    "status, name, kind, reason",
    [
        (201, "sendText.response.201.json", gateway.SENT, None),
        (404, "error.404.instance-not-found.json", gateway.PERMANENT, FailureReason.INSTANCE_NOT_FOUND),
        (400, "error.400.number-not-on-whatsapp.json", gateway.PERMANENT, FailureReason.INVALID_RECIPIENT),
        (500, "error.500.connection-closed.json", gateway.DISCONNECTED, None),
        (400, "error.400.connection-closed-number-cached.json", gateway.DISCONNECTED, None),
        (500, "error.500.instance-not-loaded.json", gateway.DISCONNECTED, None),
        (401, "error.401.unauthorized.json", gateway.MISCONFIGURED, None),
        (404, "error.404.unknown-route.json", gateway.MISCONFIGURED, None),
        (400, "error.400.validation-missing-text.json", gateway.PERMANENT, FailureReason.REJECTED),
        (400, "error.400.text-required.json", gateway.PERMANENT, FailureReason.REJECTED),
    ],
)
def test_it_classifies_real_answers(status, name, kind, reason):
    outcome = gateway.classify(status, sample(name))
    assert outcome.kind == kind
    assert outcome.reason == reason


def test_a_sent_answer_carries_the_whatsapp_id():
    outcome = gateway.classify(201, sample("sendText.response.201.json"))
    assert outcome.message_id == "3EB0C431C26A1916E07A4B"
    assert outcome.remote_jid == "5511999999999@s.whatsapp.net"


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429, 408])
def test_server_errors_are_transient(status):
    body = {"status": status, "error": "Internal Server Error", "response": {"message": "boom"}}
    assert gateway.classify(status, body).kind == gateway.TRANSIENT


def test_a_non_json_gateway_page_is_transient():
    assert gateway.classify(502, "<html>Bad gateway</html>").kind == gateway.TRANSIENT
