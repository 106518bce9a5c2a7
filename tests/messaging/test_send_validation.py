"""The send body's plain validation (bench B1): the same SendRequest as SendMessageSerializer, or none.

`plain_send_request` handles the common body without DRF's field machinery and declines anything
it is not sure about, so that SendMessageSerializer still gives every error (and every unusual
value) exactly as before. The oracle here is the serializer itself: the tests that post a body run
with the plain validator and with the serializer alone (plain_send_request declining everything).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from messaging import opt_ins
from messaging.api import serializers as serializers_module
from messaging.api.serializers import (
    MAX_METADATA_BYTES,
    MAX_VARIABLE_NAME_LENGTH,
    MAX_VARIABLE_VALUE_LENGTH,
    MAX_VARIABLES,
    SendMessageSerializer,
    plain_send_request,
)
from messaging.models import Message

URL = "/v1/messages/send"
TO = "+5511988887777"
BASE: dict[str, Any] = {"to": TO, "category": "UTILITY", "text": "Hello {{name}}", "variables": {"name": "Ana"}}


def body(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for name, value in changes.items():
        if value is _DROP:
            data.pop(name, None)
        else:
            data[name] = value
    return data


_DROP = object()

# Bodies the plain path must take (the usual ones): it would be no optimization otherwise.
PLAIN = [
    body(),
    body(variables=_DROP, text="No variables here"),
    body(category="OTP", text="Code {{ code }}", variables={"code": 123456}),
    body(category="MARKETING", variables={"name": "Ana", "n": 1.5, "ok": True, "": ""}),
    body(to="  +55 (11) 98888-7777 ", instance=" alice-main ", priority="urgent"),
    body(metadata={"order": {"id": 7, "tags": ["a", None]}, "k": None}),
    body(variables={"name": "Ana"}, metadata=None, priority=None, instance=None, deliverUntil=None),
    body(text="  spaces kept  {{name}} "),
    body(text="é" * 4096, variables={}),
    # issue 21's bounds, met exactly: 4,096 characters rendered, and the variables' own limits
    body(text="{{v}}" * 40 + "x" * 96, variables={"v": "y" * 100}),
    body(text="{{n}}" * 819, variables={"n": 1}),
    body(text="{{name}}", variables={"name": "n" * MAX_VARIABLE_VALUE_LENGTH, **{f"v{i}": i for i in range(MAX_VARIABLES - 1)}}),
    body(variables={"name": "Ana", "n" * MAX_VARIABLE_NAME_LENGTH: 1}),
    body(to="+55 (11) 98888-7777" + " " * 13),
    body(typing="off"),
    body(typing="auto", category="OTP", text="Code {{ code }}", variables={"code": 1}),
    body(typing=None),
]

# Bodies the serializer refuses: the plain path must decline them, so that the answer is the serializer's
# (test_a_refused_body_answers_the_serializers_errors posts each one).
DECLINED = [
    [],
    "text",
    {},
    body(to=_DROP),
    body(to=None),
    body(to=""),
    body(to="   "),
    body(to=5511988887777),
    body(to="+5511988887777 ext 12"),
    body(to="+551"),
    body(to="5511988887777"),
    body(category="utility"),
    body(category=None),
    body(category=["UTILITY"]),
    body(text=""),
    body(text="   "),
    body(text=None),
    body(text=42),
    body(text="x" * 4097),
    body(text="nul \x00 here"),
    body(text="lone \ud800 surrogate"),
    body(variables=[]),
    body(variables={"name": None}),
    body(variables={"name": {"nested": 1}}),
    body(variables={"name": ["a"]}),
    body(variables={"name": "nul \x00"}),
    body(variables={}),  # {{name}} is missing
    body(instance=""),
    body(instance="   "),
    body(instance=5),
    body(instance="x" * 101),
    body(instance="nul\x00"),
    body(priority="URGENT"),
    body(priority=1),
    body(metadata=[]),
    body(metadata="x"),
    body(metadata={"big": "x" * MAX_METADATA_BYTES}),
    body(metadata={"k": "nul \x00"}),
    body(deliverUntil="2999-01-01T00:00:00Z"),
    body(deliverUntil="not a date"),
    body(unknown=1),
    body(callback=None),
    # issue 21's bounds, broken by one
    body(text="{{v}}" * 41, variables={"v": "y" * 100}),
    body(text="{{v}}" * 800, variables={"v": "x" * 60_000}),
    body(text="{{n}}" * 820, variables={"n": 12345}),
    body(text="{{b}}" * 820, variables={"b": True}),
    body(variables={"name": "n" * (MAX_VARIABLE_VALUE_LENGTH + 1)}),
    body(variables={"name": "Ana", **{f"v{i}": i for i in range(MAX_VARIABLES)}}),
    body(variables={"name": "Ana", "n" * (MAX_VARIABLE_NAME_LENGTH + 1): 1}),
    body(to="+55" + " " * 30 + "11988887777"),  # a valid number, written longer than MAX_PHONE_LENGTH
    body(text=4096.5),
    body(instance=1.5),
    body(typing="OFF"),
    body(typing=""),
    body(typing=0),
    body(typing=False),
    body(typing=["off"]),
]


def drf(data: Any) -> Any:
    serializer = SendMessageSerializer(data=data)
    return serializer.to_request() if serializer.is_valid() else None


@pytest.mark.parametrize("data", PLAIN)
def test_the_plain_path_gives_what_the_serializer_gives(data):
    plain = plain_send_request(copy.deepcopy(data))
    assert plain is not None, "a usual body left the plain path"
    expected = drf(copy.deepcopy(data))
    assert expected is not None, "the plain path accepted a body the serializer refuses"
    assert plain == expected
    # the very same types too (the default priority is the enum member in both)
    assert [type(getattr(plain, f)) for f in plain.__dataclass_fields__] == [
        type(getattr(expected, f)) for f in expected.__dataclass_fields__
    ]


@pytest.mark.parametrize("data", DECLINED)
def test_unusual_or_invalid_bodies_are_left_to_the_serializer(data):
    assert plain_send_request(copy.deepcopy(data)) is None


def test_the_plain_path_does_not_share_the_bodys_dicts():
    data = body(metadata={"k": 1})
    plain = plain_send_request(data)
    assert plain is not None
    assert plain.variables == data["variables"] and plain.variables is not data["variables"]
    assert plain.metadata == data["metadata"] and plain.metadata is not data["metadata"]


@pytest.fixture
def opted_in(alice):
    opt_ins.record(alice.project, TO, "checkout")


def serializer_alone(monkeypatch: pytest.MonkeyPatch, alone: bool = True) -> None:
    """The plain validator declines every body (alone) or is the product's own again: the serializer's answer
    is the oracle it must match."""
    if alone:
        monkeypatch.setattr(serializers_module, "plain_send_request", lambda data: None)
    else:
        monkeypatch.setattr(serializers_module, "plain_send_request", plain_send_request)


@pytest.fixture(params=[True, False], ids=["plain-validator-on", "serializer-alone"])
def validator(request, monkeypatch):
    """The plain validator as the test runs it: both ways must give the very same answers."""
    serializer_alone(monkeypatch, alone=not request.param)
    return request.param


def test_a_usual_send_is_accepted_without_the_serializer(alice, alice_instance, opted_in, monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> bool:
        raise AssertionError("SendMessageSerializer used for a plain body")

    monkeypatch.setattr(SendMessageSerializer, "is_valid", refuse)
    response = alice.client().post(URL, body(metadata={"order": 7}), format="json")

    assert response.status_code == 202, response.content
    message = Message.objects.get(pk=response.json()["id"])
    assert (message.to, message.text, message.metadata, message.priority) == (TO, "Hello Ana", {"order": 7}, "normal")


@pytest.mark.parametrize(
    "data",
    [*DECLINED, body(to="+55 11 x"), body(text="", category="utility"), body(deliverUntil="soon"),
     body(text="{{name}}" * 41, variables={"name": "y" * 100}), body(text=7)],
)
def test_a_refused_body_answers_the_serializers_errors(alice, alice_instance, opted_in, validator, data):
    """Every body the plain path declines still gets SendMessageSerializer's answer, word for word."""
    serializer = SendMessageSerializer(data=copy.deepcopy(data))
    assert not serializer.is_valid()

    # Encoded here, as a client would send it: DRF's test client cannot encode a lone surrogate.
    response = alice.client().post(URL, json.dumps(data), content_type="application/json")

    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "code": "invalid_request",
            "message": "The request body is not valid; see details.fields.",
            "details": {"fields": serializer.errors},
        }
    }
    assert Message.objects.count() == 0


# What an accepted send stores from its body (the rest is the funnel's or the clock's).
STORED = ("to", "category", "template", "variables", "text", "metadata", "priority", "typing", "instance_id",
          "requested_instance", "status")


@pytest.mark.parametrize("data", PLAIN)
def test_a_usual_body_is_answered_and_stored_alike_by_the_plain_validator_and_the_serializer_alone(
        alice, alice_instance, opted_in, monkeypatch, data):
    outcomes = []
    for plain_validator in (True, False):
        serializer_alone(monkeypatch, alone=not plain_validator)
        response = alice.client().post(URL, json.dumps(data), content_type="application/json")
        answer = response.json()
        stored = None
        if response.status_code == 202:
            stored = Message.objects.filter(pk=answer.pop("id")).values(*STORED).get()
            answer.pop("createdAt", None)
            answer.pop("deliverUntil", None)
        outcomes.append((response.status_code, answer, stored))
    assert outcomes[0] == outcomes[1]
