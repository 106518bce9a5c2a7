"""GET /v1/dead-letters, POST /v1/dead-letters/{id}/resend, POST /v1/dead-letters/{id}/dismiss.

Thin views: parse, scope to the key's project and environment (another project's entry, or the other
environment's, is 404), call
messaging.resend, respond. Acting twice answers 200 with the unchanged entry.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from pilot_status.api import ClientApiView

from .. import cursors, resend
from ..models import Category, DeadLetter, DeadLetterStatus, FailureReason
from ..representations import dead_letter_body, message_body
from . import schema
from .serializers import (
    MAX_INSTANCE_NAME_LENGTH,
    MAX_PHONE_LENGTH,
    PhoneField,
    StrictCharField,
    StrictSerializer,
    given_params,
    storable,
)


class DeadLetterListQuerySerializer(StrictSerializer):
    status = serializers.ChoiceField(choices=DeadLetterStatus.values, required=False)
    reason = serializers.ChoiceField(choices=FailureReason.values, required=False)
    category = serializers.ChoiceField(choices=Category.values, required=False)
    to = PhoneField(max_length=32, required=False)
    createdAfter = serializers.DateTimeField(required=False)
    createdBefore = serializers.DateTimeField(required=False)
    cursor = serializers.CharField(required=False, max_length=200)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=200, default=50)

    def filters(self) -> dict[str, Any]:
        data = self.validated_data
        return {
            "status": data.get("status"),
            "reason": data.get("reason"),
            "category": data.get("category"),
            "to": data.get("to"),
            "created_after": data.get("createdAfter"),
            "created_before": data.get("createdBefore"),
        }


class ResendSerializer(StrictSerializer):
    deliverUntil = serializers.DateTimeField(required=False, allow_null=True, default=None)
    # Required (true) for a message that may already have been delivered (OUTCOME_UNKNOWN): else 409
    # confirmation_required and nothing changes.
    confirmMaybeDelivered = serializers.BooleanField(required=False, default=False)
    # A correction: the whole funnel judges the corrected request again (environment, instance,
    # opt-in); a refusal answers its error and changes nothing. Absent or null: keep the message's own.
    to = PhoneField(max_length=MAX_PHONE_LENGTH, required=False, allow_null=True, default=None,
                    help_text="A corrected recipient (E.164); the timeline records old → new.")
    instance = StrictCharField(max_length=MAX_INSTANCE_NAME_LENGTH, required=False, allow_null=True, default=None,
                               help_text="A corrected instance name (one of the project's); old → new in the timeline.")

    def validate_instance(self, value: str | None) -> str | None:
        if value is not None and (problem := storable(value, "instance")):
            raise serializers.ValidationError(problem)
        return value

    def correction(self) -> resend.Correction:
        return resend.Correction(to=self.validated_data["to"], instance=self.validated_data["instance"] or None)


class DismissSerializer(StrictSerializer):
    pass


def _decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        at, pk = cursors.decode(cursor)
        return at, int(pk)
    except ValueError as exc:  # BadCursor too
        raise exceptions.ValidationError({"cursor": ["Invalid cursor."]}) from exc


DeadLetterBody = inline_serializer(
    "DeadLetter",
    {
        "id": serializers.IntegerField(),
        "messageId": serializers.UUIDField(),
        "reason": serializers.ChoiceField(choices=FailureReason.values),
        "detail": serializers.CharField(),
        "lastGatewayResponse": serializers.JSONField(allow_null=True),
        "attempts": serializers.IntegerField(),
        "status": serializers.CharField(),
        "resolvedBy": serializers.CharField(allow_null=True),
        "resolvedAt": serializers.DateTimeField(allow_null=True),
        "createdAt": serializers.DateTimeField(),
        "category": serializers.CharField(),
        "to": serializers.CharField(),
        "outcomeUnknown": serializers.BooleanField(),
    },
)
DeadLetterPage = inline_serializer(
    "DeadLetterPage",
    {"data": DeadLetterBody.__class__(many=True), "nextCursor": serializers.CharField(allow_null=True)},
)


class DeadLetterListView(ClientApiView):
    @extend_schema(
        operation_id="list_dead_letters",
        summary="List failed messages waiting for review.",
        parameters=[DeadLetterListQuerySerializer],
        responses=schema.responses(200, DeadLetterPage, 400, 401, 429),
    )
    def get(self, request: Request) -> Response:
        query = DeadLetterListQuerySerializer(data=given_params(request))
        query.is_valid(raise_exception=True)
        # select_related: dead_letter_body reads the message's category and recipient per row.
        rows = resend.matching(self.project, self.environment, query.filters()).select_related("message")
        cursor = query.validated_data.get("cursor")
        if cursor:
            at, pk = _decode_cursor(cursor)
            rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk))
        limit = query.validated_data["limit"]
        page = list(rows.order_by("-created_at", "-pk")[: limit + 1])
        has_more = len(page) > limit
        page = page[:limit]
        return Response(
            {"data": [dead_letter_body(e) for e in page], "nextCursor": cursors.encode(page[-1].created_at, page[-1].pk) if has_more else None}
        )


class _DeadLetterActionView(ClientApiView):
    def entry(self, dead_letter_id: int) -> DeadLetter:
        entry: DeadLetter | None = (
            DeadLetter.objects.for_scope(self.project, self.environment).filter(pk=dead_letter_id).first()
        )
        if entry is None:
            raise exceptions.NotFound("No such dead letter.")
        return entry

    def answer(self, done: resend.Done) -> Response:
        entry = DeadLetter.objects.select_related("message__instance").get(pk=done.dead_letter.pk)
        body = dead_letter_body(entry)
        body["outcome"] = done.outcome
        body["message"] = message_body(entry.message)
        return Response(body)

    @property
    def actor(self) -> str:
        return f"api:{self.api_key.display_prefix}"


class DeadLetterResendView(_DeadLetterActionView):
    @extend_schema(
        operation_id="resend_dead_letter",
        summary="Force-resend a failed message, optionally with a corrected number or instance.",
        request=ResendSerializer,
        responses=schema.responses(200, DeadLetterBody, 400, 401, 403, 404, 405, 409, 415, 422, 429),
    )
    def post(self, request: Request, dead_letter_id: int) -> Response:
        # Parse the body before looking the entry up, so bad JSON is a 400 everywhere.
        params = ResendSerializer(data=request.data if request.data else {})
        params.is_valid(raise_exception=True)
        entry = self.entry(dead_letter_id)
        done = resend.force_resend(
            entry, self.actor, params.validated_data["deliverUntil"],
            confirm_maybe_delivered=params.validated_data["confirmMaybeDelivered"],
            correction=params.correction(),
        )
        return self.answer(done)


class DeadLetterDismissView(_DeadLetterActionView):
    @extend_schema(
        operation_id="dismiss_dead_letter",
        summary="Dismiss a dead letter without resending.",
        request=None,
        responses=schema.responses(200, DeadLetterBody, 400, 401, 404, 405, 409, 415, 429),
    )
    def post(self, request: Request, dead_letter_id: int) -> Response:
        DismissSerializer(data=request.data if request.data else {}).is_valid(raise_exception=True)
        entry = self.entry(dead_letter_id)
        return self.answer(resend.dismiss(entry, self.actor))
