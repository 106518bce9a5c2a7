"""Internal endpoints: Evolution's webhook and the counters. Thin; the work is in ingestion.receive."""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from messaging.api.throttling import take_token
from pilot_status import heartbeats, jsonbody, metrics, observe
from pilot_status.errors import error_response

from . import auth, inbox, receive, sizes

log = logging.getLogger(__name__)


@csrf_exempt
@require_POST
def webhook(request: HttpRequest, event_suffix: str = "") -> HttpResponse:
    started = time.perf_counter()
    response = _webhook_or_503(request)
    observe.observe(observe.WEBHOOK, str(response.status_code), time.perf_counter() - started)
    return response


def _webhook_or_503(request: HttpRequest) -> HttpResponse:
    try:
        return _webhook(request)
    except DatabaseError as exc:
        # Not stored: 503 is retryable for Evolution (and for our consumer and reconciler).
        log.warning("webhook: database unavailable (%s); asking the sender to retry", exc)
        metrics.evolution("webhook:unavailable")
        response = error_response(503, "unavailable", "Cannot store the event now; retry later.")
        response["Retry-After"] = "5"
        return response


def _webhook(request: HttpRequest) -> HttpResponse:
    # The bounded reader (depth, numbers, UTF-8): a hostile body is a JsonBodyError, never a
    # RecursionError. The body itself is bounded by EVOLUTION_EVENT_MAX_BYTES (ingestion.sizes), which
    # admits Evolution's real events: refusing one larger is all that can be done before reading it.
    try:
        raw = sizes.read_body(request)
    except sizes.EventTooLarge:
        metrics.evolution("webhook:too_large")
        log.warning("webhook: an event over EVOLUTION_EVENT_MAX_BYTES (%d) refused", settings.EVOLUTION_EVENT_MAX_BYTES)
        return error_response(413, "event_too_large", "The event is larger than this service takes.",
                              {"limitBytes": settings.EVOLUTION_EVENT_MAX_BYTES})
    try:
        payload: Any = jsonbody.loads(raw)
        parsed, problem = True, ""
    except jsonbody.JsonBodyError as exc:
        payload, parsed, problem = None, False, exc.reason
    # Who is calling comes first (docs/security.md: anything not authenticated is 401 and stores
    # nothing): only a caller we know (an instance, or our own processes) learns what is wrong
    # with its body.
    forwarded = isinstance(payload, dict) and payload.get("already_saved") is True
    internal = auth.is_internal(request)
    evolution = None if forwarded or not isinstance(payload, dict) else auth.authenticate_evolution(request, payload)
    if forwarded and not internal:
        return _unauthorized("Internal forwards need the internal secret.")
    if not forwarded and evolution is None and not internal:
        return _unauthorized("Unknown instance or bad Evolution credentials.")
    if evolution is not None and not forwarded:
        shed = _over_rate(evolution)
        if shed is not None:
            return shed
    if not parsed:
        return error_response(400, "invalid_json", problem)
    wrong = inbox.envelope_problem(payload)
    if wrong is not None:
        # 400 is non-retryable for Evolution: a body that is not an event never will be.
        return error_response(
            400, "not_an_evolution_event", "Expected an Evolution event: {event, instance, data}.",
            {"field": wrong, "bounds": _ENVELOPE_BOUNDS},
        )
    if not forwarded and evolution is None:  # our own process, but the event is not proven Evolution's
        return _unauthorized("Unknown instance or bad Evolution credentials.")
    received = receive.receive_forwarded(payload) if forwarded else receive.receive_webhook(payload)
    return HttpResponse(_answer_body(received.status, received.reason), content_type="application/json")


_ENVELOPE_BOUNDS = {
    "event": f"dotted lower case, at most {inbox.EVENT_NAME_MAX_CHARS} characters",
    "instance": f"an instance name: 1 to {inbox.INSTANCE_NAME_MAX_CHARS} characters, no control characters",
    "data": "an object or an array",
}


@functools.lru_cache(maxsize=256)
def _answer_body(status: str, reason: str) -> bytes:
    # A handful of (status, reason) pairs answer every webhook: encoded once each.
    return json.dumps({"status": status, "reason": reason}).encode()


# A webhook process takes an instance's tokens up to twenty at a time and may keep them this long,
# so that the limit costs no Redis round trip for most events (a new receipt is the lock's script
# and its release, nothing more: tests/ingestion/test_metrics.py); unused ones are dropped, making
# the shared limit at most twenty tokens per process stricter, never looser.
WEBHOOK_LEASE_SECONDS = 1.0


def _over_rate(instance: auth.InstanceCredentials) -> HttpResponse | None:
    """429 when this instance's webhooks are over WEBHOOK_RATE_PER_INSTANCE; None to go on.

    The client API's token bucket (Redis, shared by every webhook process; per process while
    Redis is away), one bucket per authenticated instance: a stranger never reaches it (401 first)
    and our own forwards never do (the consumer's events are already stored; shedding them would
    only cost delay-queue rounds)."""
    allowed, wait = take_token(
        f"webhook:{instance.pk}", settings.WEBHOOK_RATE_PER_INSTANCE, settings.WEBHOOK_RATE_BURST,
        lease_seconds=WEBHOOK_LEASE_SECONDS,
    )
    if allowed:
        return None
    metrics.evolution("webhook:rate_limited")
    response = error_response(
        429, "rate_limited", "Too many webhooks for this instance; retry later.",
        {"instance": instance.name, "rate_per_second": settings.WEBHOOK_RATE_PER_INSTANCE},
    )
    response["Retry-After"] = str(max(1, math.ceil(wait)))
    return response


def _unauthorized(message: str) -> HttpResponse:
    metrics.evolution("webhook:unauthorized")
    return error_response(401, "unauthorized", message)


def _metrics_allowed(request: HttpRequest) -> HttpResponse | None:
    if not auth.is_internal(request):
        return error_response(401, "unauthorized", "The metrics need the internal secret.")
    return None


@require_GET
def metrics_json(request: HttpRequest) -> HttpResponse:
    refused = _metrics_allowed(request)
    if refused is not None:
        return refused
    try:
        counters = metrics.read_all()
    except Exception as exc:  # Redis down: the counters are unreadable, say so
        log.warning("metrics: Redis unavailable (%s)", exc)
        return error_response(503, "unavailable", "The counters are unavailable (Redis).")
    # The last run of each beat task (pilot_status.heartbeats): is maintenance running at all?
    return JsonResponse({"counters": counters, "maintenance": heartbeats.read()})


@require_GET
def metrics_prometheus(request: HttpRequest) -> HttpResponse:
    refused = _metrics_allowed(request)
    if refused is not None:
        return refused
    try:
        counters = metrics.read_all()
    except Exception as exc:
        log.warning("metrics: Redis unavailable (%s)", exc)
        return HttpResponse("# counters unavailable: Redis\n", status=503, content_type="text/plain; version=0.0.4")
    return HttpResponse(metrics.prometheus_text(counters), content_type="text/plain; version=0.0.4; charset=utf-8")
