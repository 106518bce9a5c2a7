"""OpenAPI shapes for drf-spectacular: the answers and every error code, per endpoint."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, inline_serializer
from rest_framework import serializers

from ..models import FailureReason

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Same key + same body within 24 h returns the first answer; another body → 409.",
)

ErrorBody = inline_serializer(
    "Error",
    {
        "error": inline_serializer(
            "ErrorDetail",
            {
                "code": serializers.CharField(),
                "message": serializers.CharField(),
                "details": serializers.DictField(),
            },
        )
    },
)

AcceptedMessage = inline_serializer(
    "AcceptedMessage",
    {
        "id": serializers.UUIDField(),
        "status": serializers.CharField(),
        "category": serializers.CharField(),
        "to": serializers.CharField(),
        "instance": serializers.CharField(),
        "deliverUntil": serializers.DateTimeField(),
        "createdAt": serializers.DateTimeField(),
    },
)

MessageEvent = _EVENT = inline_serializer(
    "MessageEvent",
    {
        "type": serializers.CharField(),
        "at": serializers.DateTimeField(),
        "actor": serializers.CharField(allow_null=True),
        "detail": serializers.DictField(),
    },
)

# The failure reasons as the schema lists them (messages and dead letters alike; ENUM_NAME_OVERRIDES in
# settings names this one set FailureReasonEnum wherever a field carries it).
FAILURE_REASONS: list[str] = list(FailureReason.values)

_MESSAGE_FIELDS: dict[str, Any] = {
    "id": serializers.UUIDField(),
    "status": serializers.CharField(),
    # OUTCOME_UNKNOWN: an answer from Evolution was lost and the message may have been delivered.
    "failureReason": serializers.ChoiceField(choices=FAILURE_REASONS, allow_null=True),
    "failureDetail": serializers.CharField(allow_null=True),
    "category": serializers.CharField(),
    "priority": serializers.CharField(),
    "typing": serializers.ChoiceField(choices=["auto", "off"], help_text="Whether the send shows \"typing…\" first"),
    "environment": serializers.CharField(),
    "to": serializers.CharField(),
    "text": serializers.CharField(),
    "instance": serializers.CharField(),
    "attempts": serializers.IntegerField(),
    "maxAttempts": serializers.IntegerField(),
    "evolutionMessageId": serializers.CharField(allow_null=True),
    "outcomeUnknown": serializers.BooleanField(
        help_text="An answer from Evolution was lost and its records cannot tell whether the message was sent"
    ),
    "outcomeUnknownSince": serializers.DateTimeField(allow_null=True),
    "unacknowledged": serializers.BooleanField(
        help_text="SENT, and WhatsApp has not acknowledged it (no SERVER_ACK nor any later receipt) within "
        "ACK_TIMEOUT_SECONDS (default 600); false again once a receipt arrives"
    ),
    "unacknowledgedAt": serializers.DateTimeField(
        allow_null=True, help_text="When it was found unacknowledged; kept after a later receipt (history)"
    ),
    "metadata": serializers.DictField(),
    "callbackUrl": serializers.URLField(
        allow_null=True, help_text="The send's own `callbackUrl` for its `message.status` callbacks; null when it had none"
    ),
    "deliverUntil": serializers.DateTimeField(),
    "nextAttemptAt": serializers.DateTimeField(allow_null=True),
    "waitingReason": serializers.CharField(
        allow_null=True, help_text="Why a queued message waits: the sending policy's pacing, hourly_cap, daily_cap, "
        "warming_up, resting, restricted or cooling (docs/sending-policy.md), or a wait of the gateway's; null when "
        "nothing holds it"),
    "createdAt": serializers.DateTimeField(),
    "updatedAt": serializers.DateTimeField(),
    "sentAt": serializers.DateTimeField(allow_null=True),
    "serverAckAt": serializers.DateTimeField(allow_null=True),
    "deliveredAt": serializers.DateTimeField(allow_null=True),
    "readAt": serializers.DateTimeField(allow_null=True),
    "failedAt": serializers.DateTimeField(allow_null=True),
}
# A copy: DRF's serializer metaclass pops the fields out of the dict it is given, and MessageDetail
# below still needs them (without it, GET /v1/messages/{id}'s schema listed only the timeline).
Message = inline_serializer("Message", dict(_MESSAGE_FIELDS))
MessageDetail = inline_serializer(
    "MessageDetail",
    {
        **_MESSAGE_FIELDS,
        # The latest lines (at most 50), oldest first; the ones before them: GET /v1/messages/{id}/events.
        "events": _EVENT.__class__(many=True),
        "eventsNextCursor": serializers.CharField(
            allow_null=True, help_text="Older lines: GET /v1/messages/{id}/events?cursor=…; null when `events` is the whole timeline."
        ),
    },
)
MessagePage = inline_serializer(
    "MessagePage", {"data": Message.__class__(many=True), "nextCursor": serializers.CharField(allow_null=True)}
)
_INSTANCE_FIELDS: dict[str, Any] = {
    "name": serializers.CharField(),
    "state": serializers.CharField(),
    "priority": serializers.IntegerField(),
    "stateChangedAt": serializers.DateTimeField(),
    "sendProfile": serializers.ChoiceField(choices=["unofficial", "official"], help_text="How the number is paced"),
    "sendPolicy": serializers.DictField(help_text="The policy's values in force: the profile's defaults and the overrides"),
    "sendPolicyOverrides": serializers.DictField(help_text="This number's own values"),
    "healthState": serializers.ChoiceField(
        choices=["healthy", "at_risk", "resting", "restricted"],
        help_text="The health governor's judgement of the number: at_risk cuts its caps, resting and restricted hold "
        "its sends (docs/sending-policy.md)"),
    "healthChangedAt": serializers.DateTimeField(allow_null=True, help_text="When the health state last changed"),
    "coldContactsPausedUntil": serializers.DateTimeField(
        allow_null=True, help_text="The end of a cooling period (after a 463 on a cold contact): until then the "
        "number writes to no recipient it never exchanged a message with; null: none (it may have passed)"),
}
Instance = inline_serializer("Instance", dict(_INSTANCE_FIELDS))
InstanceList = inline_serializer("InstanceList", {"data": inline_serializer("InstanceItem", dict(_INSTANCE_FIELDS), many=True)})
InstanceUpdate = inline_serializer(
    "InstanceUpdate",
    {
        "sendProfile": serializers.ChoiceField(choices=["unofficial", "official"], required=False),
        "sendPolicy": serializers.DictField(
            required=False, help_text="Values to override (gap_min_seconds, hourly_max, …; docs/sending-policy.md); null drops one"
        ),
    },
)
OptIn = inline_serializer(
    "OptInRecord",
    {
        "phone": serializers.CharField(),
        "source": serializers.CharField(),
        "createdAt": serializers.DateTimeField(),
        "revokedAt": serializers.DateTimeField(allow_null=True),
    },
)

ERROR_CODES = {
    400: "invalid_request, invalid_json",
    401: "unauthorized (missing, malformed or revoked key)",
    403: "test_recipient_not_allowed, production_not_approved",
    404: "not_found",
    405: "method_not_allowed",
    409: "idempotency_conflict (send), dead_letter_resolved (resend/dismiss of a resolved entry)",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "unknown_instance, own_instance_required, no_instance_available, opt_in_required, "
         "forbidden_address, forbidden_port (a callbackUrl that may not be called), "
         "opted_out (resend of an OPTED_OUT dead letter before a new opt-in)",
    429: "rate_limited (see Retry-After)",
    503: "unavailable",
}


def responses(ok_status: int, ok_body: Any, *error_statuses: int) -> dict[int, Any]:
    result: dict[int, Any] = {ok_status: ok_body}
    for code in error_statuses:
        result[code] = OpenApiResponse(ErrorBody, description=f"error.code: {ERROR_CODES[code]}")
    return result


class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """Documents `Authorization: Bearer ps_test_…|ps_live_…` as the API's security scheme."""

    target_class = "messaging.api.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A project's API key: ps_test_… (TEST) or ps_live_… (LIVE).",
        }
