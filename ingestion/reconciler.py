"""Ingestion reconciler (seeds B): forward again events saved but never processed.

Covers a crash after the event was saved and before its business logic finished (a consumer
killed between save and forward, a web process killed mid-request).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import requests
from django.conf import settings
from django.utils import timezone

from pilot_status import metrics

from .models import IngestionEvent

log = logging.getLogger(__name__)

STALE_AFTER = timedelta(minutes=2)
BATCH = 500


def forward(event: IngestionEvent, timeout: float = 10.0) -> bool:
    """POST the saved event to the webhook handler with already_saved; True on a 2xx."""
    body = dict(event.payload) if isinstance(event.payload, dict) else {}
    body["already_saved"] = True
    try:
        response = requests.post(
            settings.INTERNAL_WEBHOOK_URL,
            json=body,
            headers={"x-internal-webhook-secret": settings.INTERNAL_WEBHOOK_SECRET},
            timeout=timeout,
        )
    except requests.RequestException as exc:
        IngestionEvent.objects.filter(pk=event.pk).update(last_error=str(exc)[:500])
        return False
    return 200 <= response.status_code < 300


def run_batch(limit: int = BATCH, stale_after: timedelta = STALE_AFTER) -> int:
    cutoff = timezone.now() - stale_after
    forwarded = 0
    for event in IngestionEvent.objects.filter(processed_at__isnull=True, received_at__lt=cutoff).order_by(
        "received_at"
    )[:limit]:
        IngestionEvent.objects.filter(pk=event.pk).update(forward_attempts=event.forward_attempts + 1)
        if forward(event):
            forwarded += 1
            metrics.evolution("reconciler:reforwarded")
    return forwarded
