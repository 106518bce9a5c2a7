"""GET /v1/messages/{id}/events: a message's timeline, newest first, a page at a time (the latest
lines also come inline in GET /v1/messages/{id}, with `eventsNextCursor` when there are more)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from pilot_status.api import ClientApiView

from .. import timeline
from ..models import Message
from ..representations import event_body
from . import schema
from .serializers import StrictSerializer, given_params


class EventsQuerySerializer(StrictSerializer):
    cursor = serializers.CharField(required=False, max_length=200)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=timeline.MAX_PAGE, default=timeline.INLINE)


EventPage = inline_serializer(
    "MessageEventPage",
    {"data": schema.MessageEvent.__class__(many=True), "nextCursor": serializers.CharField(allow_null=True)},
)


class MessageEventsView(ClientApiView):
    @extend_schema(
        operation_id="list_message_events",
        summary="A message's timeline, page by page.",
        parameters=[EventsQuerySerializer],
        responses=schema.responses(200, EventPage, 400, 401, 404, 429),
    )
    def get(self, request: Request, message_id: str) -> Response:
        query = EventsQuerySerializer(data=given_params(request))
        query.is_valid(raise_exception=True)
        message = Message.objects.for_scope(self.project, self.environment).filter(pk=message_id).first()
        if message is None:
            raise exceptions.NotFound()
        try:
            found = timeline.page(message, query.validated_data.get("cursor"), query.validated_data["limit"])
        except timeline.BadCursor as exc:
            raise exceptions.ValidationError({"cursor": [str(exc)]}) from exc
        return Response({"data": [event_body(e) for e in found.lines], "nextCursor": found.next_cursor})
