"""Ingestion reconciler (docs/internals.md, "Path of an event"): forward again events saved but never processed.

Covers a crash after an event was saved and before its business logic finished (a consumer
killed between save and forward, a web process killed mid-request) and receipts that arrived
before their message's send was committed and missed the `message_sent` hook. The forward
goes through the webhook handler like any other, so the business logic stays in one place.

An event the webhook keeps refusing is not forwarded forever: after INGESTION_MAX_FORWARDS it is given up,
marked processed with outcome DEAD (its last error kept, visible in the admin's inbox and counted as
`reconciler:dead`), and retention prunes it like any finished event.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from pilot_status import metrics

from . import forwarding
from .models import IngestionEvent

log = logging.getLogger(__name__)

BATCH = 500
# One tick must end well before the next (beat period 5 min).
DEADLINE_SECONDS = 120.0
# The web is down or refusing us: stop hammering it, the next tick tries again.
MAX_CONSECUTIVE_FAILURES = 3
DEAD = "dead"


def default_stale_after() -> timedelta:
    return timedelta(seconds=settings.INGESTION_STALE_AFTER_SECONDS)


def run_batch(limit: int = BATCH, stale_after: timedelta | None = None, deadline_s: float = DEADLINE_SECONDS) -> int:
    """Forward up to `limit` stale unprocessed events; returns how many were accepted."""
    cutoff = timezone.now() - (stale_after if stale_after is not None else default_stale_after())
    give_up()
    started = time.monotonic()
    forwarded = failures = 0
    # Fewest forwards first, then oldest (partial index ingest_unprocessed): a pass stops after
    # MAX_CONSECUTIVE_FAILURES, and events the webhook always refuses must not be the same ones at the
    # head of every pass, holding everything behind them (issue 22). Each failure counts an attempt.
    candidates = (
        IngestionEvent.objects.filter(processed_at__isnull=True, received_at__lt=cutoff)
        .order_by("forward_attempts", "received_at")
        .values_list("pk", "payload")[:limit]
    )
    for pk, payload in candidates:
        if time.monotonic() - started > deadline_s or failures >= MAX_CONSECUTIVE_FAILURES:
            break
        ok, error = forwarding.forward(payload if isinstance(payload, dict) else {})
        IngestionEvent.objects.filter(pk=pk).update(forward_attempts=F("forward_attempts") + 1, last_error=error[:500])
        if ok:
            forwarded += 1
            failures = 0
            metrics.evolution("reconciler:reforwarded")
        else:
            failures += 1
            metrics.evolution("reconciler:forward_fail")
            log.warning("reconciler: forward of event %s failed: %s", pk, error)
    return forwarded


def give_up() -> int:
    """Mark the unprocessed events forwarded INGESTION_MAX_FORWARDS times as dead; how many."""
    dead = IngestionEvent.objects.filter(
        processed_at__isnull=True, forward_attempts__gte=settings.INGESTION_MAX_FORWARDS
    ).update(processed_at=timezone.now(), outcome=DEAD)
    if dead:
        metrics.evolution("reconciler:dead", dead)
        log.warning("reconciler: %d event(s) given up after %d forwards (outcome %r; last_error says why)",
                    dead, settings.INGESTION_MAX_FORWARDS, DEAD)
    return dead
