"""Client API views: parse, authorize, call one domain function, respond."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response

from pilot_status import jsonbody, observe
from pilot_status.api import ClientApiView

from .. import callback_urls, cursors, opt_ins, test_numbers, timeline
from ..accept import AnsweredBefore, accept_message, find_idempotent_answer, refuse_if_revoked
from ..errors import Rejected
from ..models import Message, OptIn
from ..representations import iso, message_body
from . import schema
from .serializers import (
    MessageListQuerySerializer,
    OptInSerializer,
    SendMessageSerializer,
    given_params,
    phone_shaped,
    send_request,
)


# An Idempotency-Key: at most this many characters, each visible ASCII or a space (the
# Idempotency-Key header draft's sf-string). Checked before the key is looked up or stored.
MAX_IDEMPOTENCY_KEY_LENGTH = 255


def _idempotency_key(request: Request) -> str | None:
    key: str | None = request.META.get("HTTP_IDEMPOTENCY_KEY") or None
    if key is None:
        return None
    if len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        problem = f"Idempotency-Key must be at most {MAX_IDEMPOTENCY_KEY_LENGTH} characters."
    elif not (key.isascii() and key.isprintable()):
        problem = "Idempotency-Key may only hold visible ASCII characters and spaces."
    else:
        return key
    raise Rejected(400, "invalid_request", problem, {"fields": {"idempotencyKey": [problem]}})


def _request_hash(raw: bytes) -> str:
    # Same JSON, different spacing or key order, is the same request. Read within jsonbody's
    # bounds (json.loads alone raised RecursionError on deep nesting: a 500); a body it refuses
    # is hashed as sent, and answered 400 by the parser.
    try:
        canonical = json.dumps(jsonbody.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    except jsonbody.JsonBodyError:
        canonical = raw
    return hashlib.sha256(canonical).hexdigest()


def _replay(record: Any, request_hash: str) -> Response:
    if record.request_hash != request_hash:
        raise Rejected(
            409,
            "idempotency_conflict",
            "This Idempotency-Key was already used with a different request body.",
            {"idempotencyKey": record.key},
        )
    return Response(record.response, status=record.status_code, headers={"Idempotent-Replayed": "true"})


class SendMessageView(ClientApiView):
    @extend_schema(
        operation_id="send_message",
        summary="Send a message: accepted (202) and queued, or refused before anything is stored.",
        description=test_numbers.describe(),
        request=SendMessageSerializer,
        parameters=[schema.IDEMPOTENCY_KEY],
        responses=schema.responses(202, schema.AcceptedMessage, 400, 401, 403, 409, 413, 415, 422, 429),
    )
    def post(self, request: Request) -> HttpResponse:
        return self._accept(request)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        # The whole request as DRF handles it (authentication, throttling, errors), by answer code.
        started = time.perf_counter()
        response = super().dispatch(request, *args, **kwargs)
        observe.observe(observe.ACCEPT, str(response.status_code), time.perf_counter() - started)
        return response

    def _accept(self, request: Request) -> HttpResponse:
        idempotency_key = _idempotency_key(request)
        request_hash = ""
        if idempotency_key is not None:
            request_hash = _request_hash(request._request.body)
        problem: exceptions.APIException | Rejected | None = None
        try:
            send = send_request(request.data)
            if send.callback_url:
                # The contract refuses a callbackUrl that reaches our network at accept (422), not only
                # at each attempt; resolving its host is bounded (messaging.callback_urls).
                callback_urls.check(send.callback_url, self.project.pk)
        except (exceptions.ParseError, exceptions.UnsupportedMediaType, exceptions.ValidationError, Rejected) as exc:
            problem = exc
        if problem is not None:
            refuse_if_revoked(self.api_key)  # the key answers before the body (contract order)
            # The Idempotency-Key answers before the payload (contract order): a used key still
            # replays or conflicts. A valid payload has it read with the funnel's facts instead.
            record = (find_idempotent_answer(self.project, self.environment, idempotency_key)
                      if idempotency_key else None)
            if record is not None:
                return _replay(record, request_hash)
            raise problem
        try:
            body = accept_message(
                self.project,
                self.api_key,
                self.environment,
                send,
                idempotency_key,
                request_hash,
            )
        except AnsweredBefore as answered:
            return _replay(answered.record, request_hash)
        return accepted_response(body)


def accepted_response(body: dict[str, str]) -> HttpResponse:
    """The 202, encoded as DRF's JSONRenderer would (compact, UTF-8) without its response
    machinery (≈ 4 % of an accept's CPU); DRF's finalize_response still adds its headers (Allow)."""
    encoded = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    return HttpResponse(encoded, status=status.HTTP_202_ACCEPTED, content_type="application/json")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        at, pk = cursors.decode(cursor)
        return at, str(uuid.UUID(pk))  # a tampered id is a 400 here, not a database error later
    except ValueError as exc:  # BadCursor too
        raise exceptions.ValidationError({"cursor": ["Invalid cursor."]}) from exc


class MessageListView(ClientApiView):
    @extend_schema(
        operation_id="list_messages",
        summary="List the messages of this key's project and environment, newest first.",
        parameters=[MessageListQuerySerializer],
        responses=schema.responses(200, schema.MessagePage, 400, 401, 429),
    )
    def get(self, request: Request) -> Response:
        query = MessageListQuerySerializer(data=given_params(request))
        query.is_valid(raise_exception=True)
        params = query.validated_data
        rows = Message.objects.for_scope(self.project, self.environment).select_related("instance")
        if "status" in params:
            rows = rows.filter(status=params["status"])
        if "category" in params:
            rows = rows.filter(category=params["category"])
        if "to" in params:
            rows = rows.filter(to=params["to"])
        if "createdAfter" in params:
            rows = rows.filter(created_at__gte=params["createdAfter"])
        if "createdBefore" in params:
            rows = rows.filter(created_at__lt=params["createdBefore"])
        if "cursor" in params:
            at, pk = _decode_cursor(params["cursor"])
            rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk))
        limit = params["limit"]
        page = list(rows.order_by("-created_at", "-pk")[: limit + 1])
        has_more = len(page) > limit
        page = page[:limit]
        return Response(
            {
                "data": [message_body(m) for m in page],
                "nextCursor": cursors.encode(page[-1].created_at, page[-1].pk) if has_more else None,
            }
        )


class MessageDetailView(ClientApiView):
    @extend_schema(
        operation_id="get_message",
        summary="One message with its status, attempts and timeline.",
        responses=schema.responses(200, schema.MessageDetail, 401, 404, 429),
    )
    def get(self, request: Request, message_id: str) -> Response:
        message = (
            Message.objects.for_scope(self.project, self.environment).select_related("instance")
            .filter(pk=message_id).first()
        )
        if message is None:
            raise exceptions.NotFound()
        lines = timeline.latest(message)
        return Response({**message_body(message, lines.lines), "eventsNextCursor": lines.next_cursor})


def _opt_in_body(opt_in: OptIn) -> dict[str, Any]:
    return {
        "phone": opt_in.phone,
        "source": opt_in.source,
        "createdAt": iso(opt_in.created_at),
        "revokedAt": iso(opt_in.revoked_at),
    }


class OptInListView(ClientApiView):
    @extend_schema(
        operation_id="record_opt_in",
        summary="Record a recipient's transactional consent.",
        request=OptInSerializer,
        responses=schema.responses(201, schema.OptIn, 400, 401, 415, 429),
    )
    def post(self, request: Request) -> Response:
        serializer = OptInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        opt_in = opt_ins.record(
            self.project, serializer.validated_data["phone"], serializer.validated_data["source"], self.api_key
        )
        return Response(_opt_in_body(opt_in), status=status.HTTP_201_CREATED)


class OptInDetailView(ClientApiView):
    @extend_schema(
        operation_id="revoke_opt_in",
        summary="Revoke a recipient's consent.",
        parameters=[OpenApiParameter("phone", str, OpenApiParameter.PATH, description="E.164, + may be %2B")],
        responses=schema.responses(200, schema.OptIn, 401, 404, 429),
    )
    def delete(self, request: Request, phone: str) -> Response:
        # The path is held to PhoneField's shape first: phonenumbers reads past trailing junk, so
        # `+5511988887777%00` would otherwise revoke +5511988887777.
        opt_in = opt_ins.revoke(self.project, phone, self.api_key) if phone_shaped(phone) else None
        if opt_in is None:
            raise exceptions.NotFound("No live opt-in for this phone.")
        return Response(_opt_in_body(opt_in))
