"""Issue 26: the typing simulation is on by default, human-like, per message, and within the lease's bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from messaging.models import Message, Typing
from messaging.sending import budget, worker
from messaging.sending.typing_delay import delay_ms
from tests.messaging.sending_helpers import make_due, open_on_simulator, send
from tests.pilot_status.test_settings import ROOT

DEFAULTS = {"per_char_ms": 30, "otp_ms": 300, "max_ms": 3000, "jitter": 0.2}


def typed(text: str, category: str = "UTILITY", typing: str = Typing.AUTO, draw: float = 0.5, **settings: float) -> int:
    return delay_ms(text, category, typing, draw=lambda: draw, **{**DEFAULTS, **settings})  # type: ignore[arg-type]


def test_a_text_types_for_its_length_within_the_jitter_and_never_past_the_cap():
    assert typed("x" * 60) == 1800
    assert typed("x" * 60, draw=0.0) == 1440 and typed("x" * 60, draw=1.0) == 2160  # ±20 %
    assert typed("x" * 500, draw=0.0) == 3000 and typed("x" * 500, draw=1.0) == 3000  # the cap, after the jitter
    assert max(typed("x" * n, draw=d / 10) for n in range(0, 400, 7) for d in range(11)) <= 3000


def test_an_otp_types_briefly_whatever_its_length_and_off_means_none():
    assert typed("Your code is 123456", "OTP") == 300
    assert typed("x" * 4000, "OTP", draw=1.0) == 360
    assert typed("x" * 60, typing=Typing.OFF) == 0 and typed("123", "OTP", typing=Typing.OFF) == 0
    assert typed("x" * 60, per_char_ms=0) == 0 and typed("123", "OTP", otp_ms=0) == 0
    assert typed("x" * 60, max_ms=0) == 0
    assert typed("123", "OTP", otp_ms=10_000, draw=1.0) == 3000  # an OTP's delay is capped too


def test_typing_is_on_by_default_and_the_lease_covers_its_cap():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TYPING_DELAY_")}
    shown = subprocess.run(
        [sys.executable, "-c", "import django, json; django.setup(); from django.conf import settings as s; "
         "print(json.dumps([s.TYPING_DELAY_MS_PER_CHAR, s.TYPING_DELAY_OTP_MS, s.TYPING_DELAY_JITTER, "
         "s.TYPING_DELAY_MAX_MS, s.SEND_LEASE_SECONDS]))"],
        cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "pilot_status.settings"}, capture_output=True, text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    per_char, otp, jitter, cap, lease = json.loads(shown.stdout)
    assert (per_char, otp, jitter, cap) == (30, 300, 0.2, 3000)
    assert lease >= budget.lease_seconds_needed(3.0, 15.0, cap)


@pytest.fixture
def typing_on(settings):
    settings.TYPING_DELAY_MS_PER_CHAR = 30
    settings.TYPING_DELAY_OTP_MS = 300
    settings.TYPING_DELAY_JITTER = 0.2
    settings.TYPING_DELAY_MAX_MS = 3000
    return settings


@pytest.mark.parametrize("category, extra, low, high", [
    ("UTILITY", {}, 0.8 * 30 * len("Order 42 shipped"), 1.2 * 30 * len("Order 42 shipped")),
    ("OTP", {}, 240, 360),
    ("UTILITY", {"typing": "off"}, None, None),
])
def test_the_send_asks_evolution_to_type_and_waits_for_it(simulator, alice, alice_instance, typing_on,
                                                         category, extra, low, high):
    open_on_simulator(simulator, alice_instance)
    message = send(alice, category, **extra)
    make_due(message)
    assert worker.send_one(str(message.pk)) == "sent"
    [call] = simulator.sends(instance=alice_instance.name)
    if low is None:
        assert call["delay"] is None  # no `delay` key at all: sent at once
    else:
        assert low <= call["delay"] <= high
    message.refresh_from_db()
    assert message.status == "SENT"


def test_the_api_takes_stores_and_shows_the_typing_choice(alice, alice_instance):
    quiet = send(alice, typing="off")
    usual = send(alice)
    assert (quiet.typing, usual.typing) == ("off", "auto")
    shown = alice.client().get(f"/v1/messages/{quiet.pk}").json()
    assert shown["typing"] == "off"


@pytest.mark.parametrize("value", ["OFF", "slow", 1, True, ""])
def test_a_bad_typing_choice_is_a_400_naming_the_field_and_stores_nothing(alice, alice_instance, value):
    response = alice.client().post(
        "/v1/messages/send", {"to": "+5511988887777", "category": "UTILITY", "text": "hi", "typing": value},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "typing" in response.json()["error"]["details"]["fields"]
    assert not Message.objects.exists()


def test_the_openapi_schema_describes_the_typing_choice(db, client):
    spec = client.get("/v1/schema/", HTTP_ACCEPT="application/json").json()
    schemas = spec["components"]["schemas"]
    send = spec["paths"]["/v1/messages/send"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    field = schemas[send["$ref"].split("/")[-1]]["properties"]["typing"]
    assert field["default"] == "auto" and "typing" in field["description"]
    assert schemas[field["allOf"][0]["$ref"].split("/")[-1]]["enum"] == ["auto", "off"]
    assert "typing" in schemas["Message"]["properties"]
