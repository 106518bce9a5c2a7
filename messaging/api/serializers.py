"""Request shapes of the client API. Write serializers are narrow and reject unknown fields."""

from __future__ import annotations

import copy
import re
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import rules
from ..accept import SendRequest
from ..models import Category, Priority

MAX_TEXT_LENGTH = 4096
MAX_METADATA_BYTES = 4096


class StrictSerializer(serializers.Serializer):  # type: ignore[type-arg]
    """Refuses fields it does not know: a typo in a field name must not pass silently."""

    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        # DRF deep-copies every declared field for every serializer instance, which re-runs each
        # field's __init__: 13 % of an accepted send's CPU (bench B1 profile). A shallow copy is
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


@extend_schema_field(
    {
        "type": "string",
        "description": "International number: + and country code (E.164); spaces, dashes, dots and "
        "parentheses are ignored. Stored and returned as E.164.",
        "pattern": r"^\+[0-9 ().-]{7,31}$",
        "example": "+5511999990000",
    }
)
class PhoneField(serializers.CharField):
    default_error_messages = {
        "invalid_phone": "Not a valid phone number in international E.164 format (e.g. +5511999990000)."
    }

    def to_internal_value(self, data: Any) -> str:
        raw = super().to_internal_value(data)
        if not PHONE_CHARACTERS.match(raw):
            self.fail("invalid_phone")
        normalized = rules.normalize_phone(raw)
        if normalized is None:
            self.fail("invalid_phone")
        return normalized


class SendMessageSerializer(StrictSerializer):
    to = PhoneField(max_length=32)
    category = serializers.ChoiceField(choices=Category.values)
    text = serializers.CharField(max_length=MAX_TEXT_LENGTH, trim_whitespace=False)
    variables = serializers.DictField(child=serializers.JSONField(), required=False, default=dict)
    instance = serializers.CharField(max_length=100, required=False, allow_null=True, default=None)
    deliverUntil = serializers.DateTimeField(required=False, allow_null=True, default=None)
    priority = serializers.ChoiceField(choices=Priority.values, required=False, default=Priority.NORMAL)
    metadata = serializers.DictField(required=False, default=dict)

    # Optional fields where an explicit null means "not given" (SDKs send unset fields as null).
    NULL_MEANS_ABSENT = ("variables", "priority", "metadata")

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if not (v is None and k in self.NULL_MEANS_ABSENT)}
        return super().to_internal_value(data)

    def validate_text(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Text must not be blank.")
        if problem := storable(value, "text"):
            raise serializers.ValidationError(problem)
        return value

    def validate_variables(self, value: dict[str, Any]) -> dict[str, Any]:
        for name, item in value.items():
            if not isinstance(item, (str, int, float, bool)) or item is None:
                raise serializers.ValidationError(f"Variable {name!r} must be a string, number or boolean.")
        if problem := storable(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_metadata(self, value: dict[str, Any]) -> dict[str, Any]:
        import json

        if len(json.dumps(value)) > MAX_METADATA_BYTES:
            raise serializers.ValidationError(f"Metadata must be at most {MAX_METADATA_BYTES} bytes as JSON.")
        if problem := storable(value):
            raise serializers.ValidationError(problem)
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        missing = rules.missing_variables(attrs["text"], attrs["variables"])
        if missing:
            raise serializers.ValidationError(
                {"variables": [f"Missing template variable(s): {', '.join(missing)}."]}
            )
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
        )


class OptInSerializer(StrictSerializer):
    phone = PhoneField(max_length=32)
    # DRF's metaclass turns this into a declared field; the Field.source attribute is untouched.
    source = serializers.CharField(max_length=200)  # type: ignore[assignment]


class MessageListQuerySerializer(StrictSerializer):
    status = serializers.ChoiceField(choices=[s for s in ("QUEUED", "SENDING", "SENT", "SERVER_ACK", "DELIVERED", "READ", "FAILED")], required=False)
    category = serializers.ChoiceField(choices=Category.values, required=False)
    to = PhoneField(max_length=32, required=False)
    createdAfter = serializers.DateTimeField(required=False)
    createdBefore = serializers.DateTimeField(required=False)
    cursor = serializers.CharField(required=False, max_length=200)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=200, default=50)
