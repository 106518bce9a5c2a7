"""GET /api/internal/status: what an operator looks at first (issue 24), as JSON.

- `processes`: every long-running process's last heartbeat (pilot_status.heartbeats), stale ones flagged,
  and `stale`, the names of those;
- `maintenance`: the last run of each beat task;
- `outbox`: per lane, the rows waiting (`depth`), those due now (`due`), how long the oldest due row has
  been due (`oldest_due_age_seconds`) and the oldest row's age (`oldest_age_seconds`);
- `queues`: the ready tasks in each Celery queue (lanes and maintenance), and their consumers, from a
  passive queue_declare (no management plugin needed);
- `circuits`: the gateway's circuit and every instance circuit that is not closed (`closed`: how many are).

Each section is read at once and within `READINESS_TIMEOUT_SECONDS`; one that cannot be read (Redis down,
the broker away) says so in its place (`{"error": ...}`) and the page still answers 200: it is for
finding what is wrong. Credential: `Authorization: Bearer <OPS_STATUS_TOKEN>` when that is set, or the
internal secret (`x-internal-webhook-secret`), as the metrics.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from . import heartbeats
from .errors import error_response
from .health import run_within


def _bearer(request: HttpRequest) -> str | None:
    from ingestion.auth import credential

    header = request.META.get("HTTP_AUTHORIZATION", "")
    if not header.startswith("Bearer "):
        return None
    return credential(header[len("Bearer "):].strip())


def allowed(request: HttpRequest) -> bool:
    from ingestion import auth

    if auth.is_internal(request):
        return True
    token = settings.OPS_STATUS_TOKEN
    given = _bearer(request)
    return bool(token) and given is not None and hmac.compare_digest(given.encode(), token.encode())


def _processes() -> dict[str, Any]:
    found = heartbeats.processes()
    return {
        "stale_after_seconds": settings.HEARTBEAT_STALE_SECONDS,
        "stale": sorted({beat["process"] for beat in found if beat["stale"]}),
        "list": found,
    }


def _maintenance() -> dict[str, Any]:
    now = time.time()
    return {
        task: {**beat, "age_seconds": round(max(0.0, now - float(beat.get("at") or 0)), 1)}
        for task, beat in sorted(heartbeats.read().items())
    }


def _outbox() -> dict[str, Any]:
    from django.db import connection, transaction

    from pilot_status.celery import LANES

    lanes: dict[str, Any] = {
        lane: {"depth": 0, "due": 0, "oldest_due_age_seconds": None, "oldest_age_seconds": None} for lane in LANES
    }
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = %s", [int(settings.READINESS_TIMEOUT_SECONDS * 1000)])
            cursor.execute(
                """
                SELECT lane, count(*), count(*) FILTER (WHERE available_at <= now()),
                       extract(epoch FROM now() - min(available_at) FILTER (WHERE available_at <= now())),
                       extract(epoch FROM now() - min(created_at))
                FROM messaging_outboxentry GROUP BY lane
                """
            )
            for lane, depth, due, oldest_due, oldest in cursor.fetchall():
                lanes[lane] = {
                    "depth": depth, "due": due,
                    "oldest_due_age_seconds": round(float(oldest_due), 1) if oldest_due is not None else None,
                    "oldest_age_seconds": round(float(oldest), 1) if oldest is not None else None,
                }
    finally:
        connection.close()  # this thread's own connection: it ends with the thread
    return lanes


def _queues() -> dict[str, Any]:
    from kombu import Connection

    from pilot_status.celery import app

    depths: dict[str, Any] = {}
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=settings.READINESS_TIMEOUT_SECONDS) as connection:
        channel: Any = connection.channel()  # an amqp channel (queue_declare is transport-specific)
        for queue in app.conf.task_queues:
            try:
                _, ready, consumers = channel.queue_declare(queue=queue.name, passive=True)
                depths[queue.name] = {"ready": ready, "consumers": consumers}
            except connection.channel_errors as exc:  # not declared yet (no worker or relay ran): the channel closed
                depths[queue.name] = {"error": str(exc)[:200]}
                channel = connection.channel()
    return depths


def circuit_states() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The gateway's circuit and every instance's (`{"state"}`, with `open_until` unless closed); also read by
    the metrics' collector (pilot_status.scrape)."""
    from messaging.models import Instance
    from messaging.sending import breaker
    from pilot_status import metrics

    names = list(Instance.objects.order_by("name").values_list("name", flat=True))
    scopes = [breaker.GATEWAY, *(breaker.instance_scope(name) for name in names)]
    # Redis itself, not breaker's per-process fallback: this process's memory knows no one's circuit.
    untils = breaker.RedisStore(metrics.redis()).open_untils(scopes)
    now = time.time()

    def state(until: float | None) -> dict[str, Any]:
        if until is None:
            return {"state": breaker.CLOSED}
        return {"state": breaker.OPEN if now < until else breaker.HALF_OPEN, "open_until": until}

    return state(untils[0]), {name: state(until) for name, until in zip(names, untils[1:])}


def _circuits() -> dict[str, Any]:
    from messaging.sending import breaker

    gateway, every = circuit_states()
    instances = {name: state for name, state in every.items() if state["state"] != breaker.CLOSED}
    return {"gateway": gateway, "instances": instances, "closed": len(every) - len(instances)}


def _circuits_in_thread() -> dict[str, Any]:
    from django.db import connection

    try:
        return _circuits()
    finally:
        connection.close()


SECTIONS = {
    "processes": _processes,
    "maintenance": _maintenance,
    "outbox": _outbox,
    "queues": _queues,
    "circuits": _circuits_in_thread,
}


@require_GET
def status(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        return error_response(401, "unauthorized", "The status page needs OPS_STATUS_TOKEN or the internal secret.")
    results = run_within(SECTIONS, settings.READINESS_TIMEOUT_SECONDS)
    body: dict[str, Any] = {"at": time.time()}
    for name, result in results.items():
        body[name] = result["value"] if result["ok"] else {"error": result["error"]}
    response = JsonResponse(body)
    response["Cache-Control"] = "no-store"
    return response
