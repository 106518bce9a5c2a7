"""/v1/webhook-endpoints and /v1/webhook-deliveries: parse, scope to the key's project and environment
(another project's endpoint, or the other environment's, is 404), call callbacks.endpoints, respond. Same
auth, throttle and error envelope as every /v1 route (pilot_status.api.ClientApiView)."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db.models import Q
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from messaging import cursors
from messaging.api.schema import ErrorBody
from messaging.api.serializers import StrictSerializer, given_params
from messaging.representations import iso
from pilot_status.api import ClientApiView

from .. import endpoints
from ..models import Delivery, DeliveryAttempt, DeliveryStatus, EventType, WebhookEndpoint

ATTEMPTS_SHOWN = 10

_ERRORS = {
    400: "invalid_request, invalid_json",
    401: "unauthorized",
    404: "not_found",
    409: "too_many_endpoints (create), endpoint_disabled (replay)",
    415: "unsupported_media_type",
    422: "forbidden_address, forbidden_port, invalid_url (the URL may not be called)",
    429: "rate_limited (see Retry-After; replays also per endpoint, CALLBACKS_REPLAYS_PER_MINUTE)",
}


def _responses(ok_status: int, ok_body: Any, *codes: int) -> dict[int, Any]:
    from drf_spectacular.utils import OpenApiResponse

    return {ok_status: ok_body, **{code: OpenApiResponse(ErrorBody, description=f"error.code: {_ERRORS[code]}") for code in codes}}


class EventTypesField(serializers.ListField):  # type: ignore[type-arg]
    def __init__(self, **kwargs: Any):
        super().__init__(child=serializers.ChoiceField(choices=EventType.values), min_length=1, max_length=len(EventType.values), **kwargs)


class EndpointCreateSerializer(StrictSerializer):
    url = serializers.CharField(max_length=settings.CALLBACKS_MAX_URL_LENGTH, trim_whitespace=False)
    eventTypes = EventTypesField()
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class EndpointUpdateSerializer(StrictSerializer):
    url = serializers.CharField(max_length=settings.CALLBACKS_MAX_URL_LENGTH, trim_whitespace=False, required=False)
    eventTypes = EventTypesField(required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False)


class ReplayFailedSerializer(StrictSerializer):
    since = serializers.DateTimeField()


class EmptySerializer(StrictSerializer):
    pass


class DeliveryListQuerySerializer(StrictSerializer):
    status = serializers.ChoiceField(choices=DeliveryStatus.values, required=False)
    cursor = serializers.CharField(required=False, max_length=200)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=20)


EndpointBody = inline_serializer(
    "WebhookEndpoint",
    {
        "id": serializers.UUIDField(),
        "url": serializers.CharField(),
        "description": serializers.CharField(),
        "eventTypes": serializers.ListField(child=serializers.ChoiceField(choices=EventType.values)),
        "perMessage": serializers.BooleanField(help_text="The project's endpoint for sends with a callbackUrl (made on the first one)"),
        "enabled": serializers.BooleanField(),
        "disabledReason": serializers.CharField(allow_null=True),
        "disabledAt": serializers.DateTimeField(allow_null=True),
        "failingSince": serializers.DateTimeField(allow_null=True),
        "circuit": serializers.DictField(),
        "secret": serializers.CharField(required=False, help_text="Only in the answers to create and rotate-secret"),
        "createdAt": serializers.DateTimeField(),
        "updatedAt": serializers.DateTimeField(),
    },
)
EndpointList = inline_serializer("WebhookEndpointList", {"data": EndpointBody.__class__(many=True)})
AttemptBody = inline_serializer(
    "WebhookAttempt",
    {
        "at": serializers.DateTimeField(),
        "url": serializers.CharField(),
        "requestHeaders": serializers.DictField(),
        "responseStatus": serializers.IntegerField(allow_null=True),
        "responseBody": serializers.CharField(),
        "durationMs": serializers.IntegerField(),
        "error": serializers.CharField(allow_null=True),
        "succeeded": serializers.BooleanField(),
    },
)
DeliveryBody = inline_serializer(
    "WebhookDelivery",
    {
        "id": serializers.UUIDField(),
        "endpointId": serializers.UUIDField(),
        "url": serializers.CharField(allow_null=True, help_text="The send's callbackUrl, for the per-message endpoint"),
        "webhookId": serializers.CharField(),
        "eventType": serializers.ChoiceField(choices=EventType.values),
        "messageId": serializers.UUIDField(allow_null=True),
        "status": serializers.ChoiceField(choices=DeliveryStatus.values),
        "attempts": serializers.IntegerField(),
        "nextAttemptAt": serializers.DateTimeField(allow_null=True),
        "lastAttemptAt": serializers.DateTimeField(allow_null=True),
        "deliveredAt": serializers.DateTimeField(allow_null=True),
        "createdAt": serializers.DateTimeField(),
        "payload": serializers.DictField(),
        "attemptLog": AttemptBody.__class__(many=True),
    },
)
DeliveryPage = inline_serializer(
    "WebhookDeliveryPage", {"data": DeliveryBody.__class__(many=True), "nextCursor": serializers.CharField(allow_null=True)}
)
ReplayedCount = inline_serializer("WebhookReplayFailed", {"replayed": serializers.IntegerField()})
ENDPOINT_ID = OpenApiParameter("endpoint_id", uuid.UUID, OpenApiParameter.PATH)


def endpoint_body(endpoint: WebhookEndpoint, with_secret: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(endpoint.pk),
        "url": endpoint.url,
        "description": endpoint.description,
        "eventTypes": list(endpoint.event_types),
        "perMessage": endpoint.per_message,
        "enabled": endpoint.enabled,
        "disabledReason": endpoint.disabled_reason or None,
        "disabledAt": iso(endpoint.disabled_at),
        "failingSince": iso(endpoint.failing_since),
        "circuit": {"state": endpoint.circuit_state, "failures": endpoint.circuit_failures, "retryAt": iso(endpoint.circuit_retry_at)},
        "createdAt": iso(endpoint.created_at),
        "updatedAt": iso(endpoint.updated_at),
    }
    if with_secret:
        body["secret"] = endpoint.secret
    return body


def attempt_body(attempt: DeliveryAttempt) -> dict[str, Any]:
    return {
        "at": iso(attempt.attempted_at),
        "url": attempt.url,
        "requestHeaders": attempt.request_headers,
        "responseStatus": attempt.response_status,
        "responseBody": attempt.response_body,
        "durationMs": attempt.duration_ms,
        "error": attempt.error or None,
        "succeeded": attempt.succeeded,
    }


def delivery_body(delivery: Delivery, attempts: list[DeliveryAttempt]) -> dict[str, Any]:
    return {
        "id": str(delivery.pk),
        "endpointId": str(delivery.endpoint_id),
        "url": delivery.url or None,
        "webhookId": delivery.webhook_id,
        "eventType": delivery.event_type,
        "messageId": str(delivery.message_id) if delivery.message_id else None,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "nextAttemptAt": iso(delivery.next_attempt_at) if delivery.status == DeliveryStatus.PENDING else None,
        "lastAttemptAt": iso(delivery.last_attempt_at),
        "deliveredAt": iso(delivery.delivered_at),
        "createdAt": iso(delivery.created_at),
        "payload": delivery.payload,
        "attemptLog": [attempt_body(a) for a in attempts],
    }


def recent_attempts(deliveries: list[Delivery]) -> dict[Any, list[DeliveryAttempt]]:
    found: dict[Any, list[DeliveryAttempt]] = {d.pk: [] for d in deliveries}
    rows = DeliveryAttempt.objects.filter(delivery__in=[d.pk for d in deliveries]).order_by("-attempted_at", "-pk")
    for attempt in rows[: ATTEMPTS_SHOWN * max(1, len(deliveries))]:
        if len(found[attempt.delivery_id]) < ATTEMPTS_SHOWN:
            found[attempt.delivery_id].append(attempt)
    return found


def _body(request: Request) -> Any:
    return request.data if request.data else {}


class _EndpointView(ClientApiView):
    def endpoint(self, endpoint_id: uuid.UUID) -> WebhookEndpoint:
        scoped = endpoints.for_scope(self.project, self.environment)
        found: WebhookEndpoint | None = scoped.filter(pk=endpoint_id).first()
        if found is None:
            raise exceptions.NotFound("No such webhook endpoint.")
        return found


class EndpointListView(_EndpointView):
    @extend_schema(
        operation_id="list_webhook_endpoints",
        summary="List the webhook endpoints of this key's project and environment.",
        responses=_responses(200, EndpointList, 401, 429),
    )
    def get(self, request: Request) -> Response:
        rows = endpoints.for_scope(self.project, self.environment).order_by("created_at", "pk")
        return Response({"data": [endpoint_body(e) for e in rows]})

    @extend_schema(
        operation_id="create_webhook_endpoint",
        summary="Create a webhook endpoint; its signing secret is shown once.",
        request=EndpointCreateSerializer,
        responses=_responses(201, EndpointBody, 400, 401, 409, 415, 422, 429),
    )
    def post(self, request: Request) -> Response:
        params = EndpointCreateSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        created = endpoints.create(self.project, self.environment, data["url"], data["eventTypes"], data["description"])
        return Response(endpoint_body(created, with_secret=True), status=status.HTTP_201_CREATED)


class EndpointDetailView(_EndpointView):
    @extend_schema(
        operation_id="get_webhook_endpoint",
        summary="One webhook endpoint.",
        parameters=[ENDPOINT_ID], responses=_responses(200, EndpointBody, 401, 404, 429),
    )
    def get(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        return Response(endpoint_body(self.endpoint(endpoint_id)))

    @extend_schema(
        operation_id="update_webhook_endpoint",
        summary="Change an endpoint's URL, event types or enabled state.",
        parameters=[ENDPOINT_ID],
        request=EndpointUpdateSerializer,
        responses=_responses(200, EndpointBody, 400, 401, 404, 415, 422, 429),
    )
    def patch(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        params = EndpointUpdateSerializer(data=_body(request))
        params.is_valid(raise_exception=True)
        return Response(endpoint_body(endpoints.update(self.endpoint(endpoint_id), dict(params.validated_data))))

    @extend_schema(
        operation_id="delete_webhook_endpoint",
        summary="Delete a webhook endpoint.",
        parameters=[ENDPOINT_ID], responses=_responses(204, None, 401, 404, 429),
    )
    def delete(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        endpoints.delete(self.endpoint(endpoint_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RotateSecretView(_EndpointView):
    @extend_schema(
        operation_id="rotate_webhook_endpoint_secret",
        summary="Rotate an endpoint's signing secret; the new one is shown once.",
        parameters=[ENDPOINT_ID], request=None,
        responses=_responses(200, EndpointBody, 400, 401, 404, 415, 429),
    )
    def post(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        EmptySerializer(data=_body(request)).is_valid(raise_exception=True)
        return Response(endpoint_body(endpoints.rotate_secret(self.endpoint(endpoint_id)), with_secret=True))


class EndpointDeliveriesView(_EndpointView):
    @extend_schema(
        operation_id="list_webhook_deliveries",
        summary="An endpoint's deliveries with their attempts.",
        parameters=[ENDPOINT_ID, DeliveryListQuerySerializer],
        responses=_responses(200, DeliveryPage, 400, 401, 404, 429),
    )
    def get(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        query = DeliveryListQuerySerializer(data=given_params(request))
        query.is_valid(raise_exception=True)
        endpoint = self.endpoint(endpoint_id)
        rows = Delivery.objects.filter(endpoint=endpoint)
        if query.validated_data.get("status"):
            rows = rows.filter(status=query.validated_data["status"])
        cursor = query.validated_data.get("cursor")
        if cursor:
            try:
                at, pk = cursors.decode(cursor)
                rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=uuid.UUID(pk)))
            except ValueError as exc:
                raise exceptions.ValidationError({"cursor": ["Invalid cursor."]}) from exc
        limit = query.validated_data["limit"]
        page = list(rows.order_by("-created_at", "-pk")[: limit + 1])
        more = len(page) > limit
        page = page[:limit]
        attempts = recent_attempts(page)
        return Response(
            {
                "data": [delivery_body(d, attempts[d.pk]) for d in page],
                "nextCursor": cursors.encode(page[-1].created_at, page[-1].pk) if more else None,
            }
        )


class ReplayFailedView(_EndpointView):
    @extend_schema(
        operation_id="replay_failed_webhook_deliveries",
        summary="Deliver an endpoint's failed deliveries again.",
        parameters=[ENDPOINT_ID], request=ReplayFailedSerializer,
        responses=_responses(200, ReplayedCount, 400, 401, 404, 409, 415, 429),
    )
    def post(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        params = ReplayFailedSerializer(data=_body(request))
        params.is_valid(raise_exception=True)
        return Response({"replayed": endpoints.replay_failed(self.endpoint(endpoint_id), params.validated_data["since"])})


class DeliveryReplayView(ClientApiView):
    @extend_schema(
        operation_id="replay_webhook_delivery",
        summary="Deliver one delivery again.",
        parameters=[OpenApiParameter("delivery_id", uuid.UUID, OpenApiParameter.PATH)],
        request=None, responses=_responses(200, DeliveryBody, 400, 401, 404, 409, 415, 429),
    )
    def post(self, request: Request, delivery_id: uuid.UUID) -> Response:
        EmptySerializer(data=_body(request)).is_valid(raise_exception=True)
        delivery = (
            endpoints.deliveries_for_scope(self.project, self.environment).select_related("endpoint")
            .filter(pk=delivery_id).first()
        )
        if delivery is None:
            raise exceptions.NotFound("No such webhook delivery.")
        replayed = endpoints.replay(delivery)
        return Response(delivery_body(replayed, recent_attempts([replayed])[replayed.pk]))
