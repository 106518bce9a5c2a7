"""POST /api/internal/webhook[/<event-suffix>]: thin; the work is in ingestion.receive."""

from __future__ import annotations

import json
import logging
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from pilot_status import metrics
from pilot_status.errors import error_response

from . import auth, inbox, receive

log = logging.getLogger(__name__)


@csrf_exempt
@require_POST
def webhook(request: HttpRequest, event_suffix: str = "") -> JsonResponse:
    try:
        payload: Any = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        return error_response(400, "invalid_json", "The body is not valid JSON.")
    if not inbox.is_evolution_event(payload):
        return error_response(400, "not_an_evolution_event", "Expected an Evolution event: {event, instance, data}.")
    already_saved = payload.get("already_saved") is True
    try:
        if already_saved:
            if not auth.is_internal(request):
                metrics.evolution("webhook:unauthorized")
                return error_response(401, "unauthorized", "Internal forwards need the internal secret.")
            outcome = receive.receive_forwarded(payload)
        else:
            if auth.authenticate_evolution(request, payload) is None:
                metrics.evolution("webhook:unauthorized")
                return error_response(401, "unauthorized", "Unknown instance or bad Evolution credentials.")
            outcome = receive.receive_webhook(payload)
    except DatabaseError:
        log.warning("webhook: database unavailable, asking Evolution to retry")
        return error_response(503, "unavailable", "Cannot store the event now; retry later.")
    return JsonResponse({"status": outcome})
