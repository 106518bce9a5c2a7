"""Request shapes of the client API. Write serializers are narrow and reject unknown fields."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import rules
from ..accept import SendRequest
from ..models import Category, Priority, Typing

# Bounds of a send and an opt-in (issue 21: bounded work per request). Each is checked by the
# serializer and by the plain path below alike, before anything is stored; breaking one is a 400
# `invalid_request` naming the field. The body as a whole is bounded before that: at most
# DATA_UPLOAD_MAX_MEMORY_SIZE bytes (413), JSON at most jsonbody.MAX_DEPTH deep with numbers of at
# most jsonbody.MAX_NUMBER_CHARACTERS characters (400 `invalid_json`).
MAX_TEXT_LENGTH = 4096  # the template as given; once rendered it must fit rules.MAX_RENDERED_LENGTH too
MAX_METADATA_BYTES = 4096  # metadata as JSON
MAX_VARIABLES = 100  # names in `variables`, used or not
MAX_VARIABLE_NAME_LENGTH = 64  # a name; the template's {{name}} has no length limit of its own
MAX_VARIABLE_VALUE_LENGTH = rules.MAX_RENDERED_LENGTH  # a string value: a longer one can never fit
MAX_PHONE_LENGTH = 32  # `to`, an opt-in's `phone` and the revoke path, as written (separators included)
MAX_INSTANCE_NAME_LENGTH = 100  # `instance`
MAX_SOURCE_LENGTH = 200  # an opt-in's `source`


class StrictSerializer(serializers.Serializer):  # type: ignore[type-arg]
    """Refuses fields it does not know: a typo in a field name must not pass silently."""

    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        # DRF deep-copies every declared field for every serializer instance, which re-runs each
        # field's __init__, a visible share of an accepted send's CPU. A shallow copy is
        # enough here: bind() only sets the copy's own attributes, and no serializer of ours
        # changes a field (or a child field, which the copies share) after declaring it.
        return {name: copy.copy(field) for name, field in self._declared_fields.items()}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def given_params(request: Any) -> dict[str, str]:
    """The query parameters that carry a value: `?status=&cursor=` means no filter and no cursor
    (the contract writes the list URL that way), not an invalid one."""
    return {name: value for name, value in request.query_params.dict().items() if value != ""}


# Digits (any script: phonenumbers reads them), a leading +, and the usual separators. Anything
# else — "ext 12", "x3", letters — would be dropped by the parser, and the message would go to a
# number the client did not write.
PHONE_CHARACTERS = re.compile(r"^[+\d\s().\-]+$")


def phone_shaped(raw: str) -> bool:
    """Whether a phone given outside a body (the revoke path) has PhoneField's shape."""
    return len(raw) <= MAX_PHONE_LENGTH and PHONE_CHARACTERS.match(raw) is not None


def storable(value: Any, path: str = "") -> str | None:
    """Where a JSON value holds text Postgres cannot store (NUL, an unpaired surrogate), else None."""
    if isinstance(value, str):
        if "\x00" in value:
            return f"{path or 'value'}: the NUL character is not allowed."
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{path or 'value'}: not valid Unicode (unpaired surrogate)."
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            problem = storable(key, f"{path}.{key!r}" if path else repr(key)) or storable(item, f"{path}.{key}" if path else str(key))
            if problem:
                return problem
    if isinstance(value, list):
        for i, item in enumerate(value):
            if problem := storable(item, f"{path}[{i}]"):
                return problem
    return None


def text_problem(value: str) -> str | None:
    if not value.strip():
        return "Text must not be blank."
    return storable(value, "text")


def variables_problem(value: dict[str, Any]) -> str | None:
    if len(value) > MAX_VARIABLES:
        return f"At most {MAX_VARIABLES} variables."
    for name, item in value.items():
        if len(name) > MAX_VARIABLE_NAME_LENGTH:  # first: the messages below quote the name
            return f"A variable name is longer than {MAX_VARIABLE_NAME_LENGTH} characters."
        if not isinstance(item, (str, int, float, bool)) or item is None:
            return f"Variable {name!r} must be a string, number or boolean."
        if type(item) is str and len(item) > MAX_VARIABLE_VALUE_LENGTH:
            return f"Variable {name!r} is longer than {MAX_VARIABLE_VALUE_LENGTH} characters."
    return storable(value)


def rendered_problem(template: str, variables: dict[str, Any]) -> str | None:
    """The rendered text's length, measured before it is rendered (the check costs one pass over
    the template, whatever the values)."""
    length = rules.rendered_length(template, variables)
    if length > rules.MAX_RENDERED_LENGTH:
        return (f"The text is {length} characters once its variables are filled in; "
                f"at most {rules.MAX_RENDERED_LENGTH} (WhatsApp's limit).")
    return None


def metadata_problem(value: dict[str, Any]) -> str | None:
    if len(json.dumps(value)) > MAX_METADATA_BYTES:
        return f"Metadata must be at most {MAX_METADATA_BYTES} bytes as JSON."
    return storable(value)


class StrictCharField(serializers.CharField):
    """A CharField that takes only a JSON string. DRF's turns a number into its text, so
    `"text": 1` would send "1" and `"instance": 5` would look for an instance named "5": a wrong
    type is a 400 instead (issue 21), with DRF's own "Not a valid string." """

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        value: str = super().to_internal_value(data)
        return value


@extend_schema_field(
    {
        "type": "string",
        "description": "International number: + and country code (E.164); spaces, dashes, dots and "
        "parentheses are ignored. Stored and returned as E.164.",
        "pattern": r"^\+[0-9 ().-]{7,31}$",
        "example": "+5511999990000",
    }
)
class PhoneField(StrictCharField):
    default_error_messages = {
        "invalid_phone": "Not a valid phone number in international E.164 format (e.g. +5511999990000)."
    }

    def to_internal_value(self, data: Any) -> str:
        raw = super().to_internal_value(data)
        # max_length as written: DRF's validator would only see the normalized number, after the
        # regular expression and phonenumbers had read a value of any length.
        if self.max_length is not None and len(raw) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        if not PHONE_CHARACTERS.match(raw):
            self.fail("invalid_phone")
        normalized = rules.normalize_phone(raw)
        if normalized is None:
            self.fail("invalid_phone")
        return normalized


class SendMessageSerializer(StrictSerializer):
    to = PhoneField(max_length=MAX_PHONE_LENGTH)
    category = serializers.ChoiceField(choices=Category.values)
    text = StrictCharField(
        max_length=MAX_TEXT_LENGTH, trim_whitespace=False,
        help_text=f"The template; {{{{name}}}} takes the value of `variables.name`. At most {MAX_TEXT_LENGTH} characters as "
        f"written and, once its variables are filled in, at most {rules.MAX_RENDERED_LENGTH} (WhatsApp's limit).",
    )
    variables = serializers.DictField(
        child=serializers.JSONField(), required=False, default=dict,
        help_text=f"Strings, numbers or booleans; at most {MAX_VARIABLES} names of at most {MAX_VARIABLE_NAME_LENGTH} "
        f"characters, string values of at most {MAX_VARIABLE_VALUE_LENGTH}.",
    )
    instance = StrictCharField(max_length=MAX_INSTANCE_NAME_LENGTH, required=False, allow_null=True, default=None)
    deliverUntil = serializers.DateTimeField(
        required=False, allow_null=True, default=None, help_text=rules.deliver_until_help()
    )
    priority = serializers.ChoiceField(choices=Priority.values, required=False, default=Priority.NORMAL)
    metadata = serializers.DictField(required=False, default=dict)
    typing = serializers.ChoiceField(
        choices=Typing.values, required=False, default=Typing.AUTO,
        help_text="`auto` (default): Evolution shows \"typing…\" first, for a human-like time (about 30 ms per "
        "character, at most 3 s, ±20 %; an OTP 0.3 s), and the send waits for it. `off`: sent at once.",
    )

    callbackUrl = StrictCharField(
        max_length=settings.CALLBACKS_MAX_URL_LENGTH, required=False, allow_null=True, default=None, trim_whitespace=False,
        help_text="http(s) URL that gets this message's `message.status` callbacks (signed with the project's "
        "per-message endpoint secret, listed by GET /v1/webhook-endpoints); port 80 or 443, and its host must resolve to "
        "public addresses, checked at accept (422 otherwise) and again before every attempt.",
    )

    # Optional fields where an explicit null means "not given" (SDKs send unset fields as null).
    NULL_MEANS_ABSENT = ("variables", "priority", "metadata", "typing")

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if not (v is None and k in self.NULL_MEANS_ABSENT)}
        return super().to_internal_value(data)

    def validate_text(self, value: str) -> str:
        if problem := text_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_variables(self, value: dict[str, Any]) -> dict[str, Any]:
        if problem := variables_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_metadata(self, value: dict[str, Any]) -> dict[str, Any]:
        if problem := metadata_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_callbackUrl(self, value: str | None) -> str | None:  # noqa: N802 (DRF's validate_<field>)
        # Its shape only: the view then checks its port and addresses (messaging.callback_urls), and
        # callbacks checks them again before every attempt (docs/security.md "Callbacks").
        if value is not None:
            try:
                URLValidator(schemes=["http", "https"])(value)
            except DjangoValidationError as exc:
                raise serializers.ValidationError("Must be an http:// or https:// URL.") from exc
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        missing = rules.missing_variables(attrs["text"], attrs["variables"])
        if missing:
            raise serializers.ValidationError(
                {"variables": [f"Missing template variable(s): {', '.join(missing)}."]}
            )
        if problem := rendered_problem(attrs["text"], attrs["variables"]):
            raise serializers.ValidationError({"text": [problem]})
        deliver_until = attrs.get("deliverUntil")
        if deliver_until is not None:
            code = rules.check_deliver_until(attrs["category"], deliver_until, timezone.now())
            if code == "deliver_until_in_past":
                raise serializers.ValidationError({"deliverUntil": ["Must be in the future."]})
            if code == "deliver_until_too_far":
                limit = rules.MAX_TTL[Category(attrs["category"])]
                raise serializers.ValidationError(
                    {"deliverUntil": [f"At most {int(limit.total_seconds())} s ahead for {attrs['category']}."]}
                )
        return attrs

    def to_request(self) -> SendRequest:
        data = self.validated_data
        return SendRequest(
            to=data["to"],
            category=data["category"],
            template=data["text"],
            variables=data["variables"],
            instance=data["instance"] or None,
            deliver_until=data["deliverUntil"],
            priority=data["priority"],
            metadata=data["metadata"],
            typing=data["typing"],
            callback_url=data["callbackUrl"] or "",
        )


# ---- the common send body without DRF ----------------------------------------------------
#
# DRF's field machinery (run_validation, validators, error collection per field) was the largest
# share of an accepted send's CPU after the database and Redis (bench B1). `plain_send_request`
# checks the usual body directly and gives up (None) on anything it is not sure DRF would
# accept with the very same values: then SendMessageSerializer decides, so every error body and
# every unusual input (deliverUntil, a broken bound, …) is exactly DRF's answer. What it saves:
# bench/findings.md, "The second validator".

_SEND_FIELDS = frozenset(SendMessageSerializer._declared_fields)
_CATEGORIES = frozenset(Category.values)
_PRIORITIES = frozenset(Priority.values)
_TYPINGS = frozenset(Typing.values)
_VARIABLE_TYPES = (str, int, float, bool)


def _plain_to(value: Any) -> str | None:
    # PhoneField: a string, stripped, not blank, not too long, only phone characters, a valid number.
    if type(value) is not str:
        return None
    value = value.strip()
    if not value or len(value) > MAX_PHONE_LENGTH or not PHONE_CHARACTERS.match(value):
        return None
    return rules.normalize_phone(value)


def _plain_text(value: Any) -> str | None:
    # CharField(trim_whitespace=False, max_length) and validate_text (storable() also covers
    # DRF's NUL and surrogate validators).
    if type(value) is not str or len(value) > MAX_TEXT_LENGTH or text_problem(value):
        return None
    return value


def _plain_dict(value: Any) -> dict[str, Any] | None:
    # DictField: a dict; its copy keyed by str (JSON keys always are).
    if type(value) is not dict or any(type(key) is not str for key in value):
        return None
    return dict(value)


def _plain_variables(value: Any) -> dict[str, Any] | None:
    # DictField(child=JSONField()) and validate_variables: JSON scalars, no null (DRF says
    # "may not be null" for those; here it simply decides).
    variables = _plain_dict(value)
    if variables is None or any(type(item) not in _VARIABLE_TYPES for item in variables.values()):
        return None
    return None if variables_problem(variables) else variables


def _plain_metadata(value: Any) -> dict[str, Any] | None:
    metadata = _plain_dict(value)
    return None if metadata is None or metadata_problem(metadata) else metadata


def _plain_instance(value: Any) -> str | None:
    # CharField(max_length=100): stripped, not blank. None means "not given" here.
    if type(value) is not str:
        return None
    name: str = value.strip()
    if not name or len(name) > MAX_INSTANCE_NAME_LENGTH or storable(name):
        return None
    return name


def plain_send_request(data: Any) -> SendRequest | None:
    """The SendRequest SendMessageSerializer would give for a plain, valid body, else None."""
    if type(data) is not dict or not data.keys() <= _SEND_FIELDS or "callbackUrl" in data:
        return None
    if data.get("deliverUntil") is not None:
        return None  # date parsing and its limits: DRF's DateTimeField decides
    to = _plain_to(data.get("to"))
    category = data.get("category")
    text = _plain_text(data.get("text"))
    if to is None or type(category) is not str or category not in _CATEGORIES or text is None:
        return None
    raw = data.get("variables")
    variables = {} if raw is None else _plain_variables(raw)
    raw = data.get("metadata")
    metadata = {} if raw is None else _plain_metadata(raw)
    raw = data.get("instance")
    instance = None if raw is None else _plain_instance(raw)
    priority = data.get("priority")
    if priority is None:
        priority = Priority.NORMAL
    elif type(priority) is not str or priority not in _PRIORITIES:
        return None
    typing_choice = data.get("typing")
    if typing_choice is None:
        typing_choice = Typing.AUTO
    elif type(typing_choice) is not str or typing_choice not in _TYPINGS:
        return None
    if variables is None or metadata is None or (raw is not None and instance is None):
        return None
    if rules.missing_variables(text, variables) or rendered_problem(text, variables):
        return None
    return SendRequest(to=to, category=category, template=text, variables=variables, instance=instance,
                       deliver_until=None, priority=priority, metadata=metadata, typing=typing_choice)


def send_request(data: Any) -> SendRequest:
    """The validated send request; raises DRF's ValidationError exactly as the serializer does."""
    plain = plain_send_request(data)
    if plain is not None:
        return plain
    serializer = SendMessageSerializer(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.to_request()


class OptInSerializer(StrictSerializer):
    phone = PhoneField(max_length=MAX_PHONE_LENGTH)
    # DRF's metaclass turns this into a declared field; the Field.source attribute is untouched.
    source = StrictCharField(max_length=MAX_SOURCE_LENGTH)  # type: ignore[assignment]


class MessageListQuerySerializer(StrictSerializer):
    status = serializers.ChoiceField(choices=[s for s in ("QUEUED", "SENDING", "SENT", "SERVER_ACK", "DELIVERED", "READ", "FAILED")], required=False)
    category = serializers.ChoiceField(choices=Category.values, required=False)
    to = PhoneField(max_length=MAX_PHONE_LENGTH, required=False)
    createdAfter = serializers.DateTimeField(required=False)
    createdBefore = serializers.DateTimeField(required=False)
    cursor = serializers.CharField(required=False, max_length=200)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=200, default=50)
