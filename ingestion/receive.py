"""The one way in for an Evolution event: lock, inbox, business logic (seeds.md B)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pilot_status import metrics

from . import handlers, inbox
from .locks import event_lock
from .models import Channel, IngestionEvent

log = logging.getLogger(__name__)

PROCESSED = "processed"
SKIPPED = "skipped"


@dataclass(frozen=True)
class Received:
    status: str  # PROCESSED or SKIPPED: what the webhook answers
    reason: str  # the handler's outcome, or why it was skipped

    def as_json(self) -> dict[str, str]:
        return {"status": self.status, "reason": self.reason}


def receive_webhook(payload: dict[str, Any]) -> Received:
    """An event from Evolution's webhook: store it (channel WEBHOOK) and apply it once.

    Database errors propagate (the view answers 503 so that Evolution retries).
    """
    with event_lock(inbox.dedup_key(payload)) as acquired:
        if not acquired:
            # The other channel (or a duplicate POST) holds it right now and will finish it;
            # if that holder dies, its copy is redelivered or the reconciler picks it up.
            metrics.evolution("webhook:skipped")
            return Received(SKIPPED, "in_progress_elsewhere")
        event, created = inbox.record(Channel.WEBHOOK, payload)
        if not created and event.processed_at is not None:
            metrics.evolution("webhook:skipped")
            return Received(SKIPPED, "already_processed")
        return _apply(event)


def receive_forwarded(payload: dict[str, Any]) -> Received:
    """An event already saved by the consumer or the reconciler: run the business logic only.

    No lock here: the forwarding consumer holds it while it waits for this answer.
    """
    event = IngestionEvent.objects.filter(dedup_key=inbox.dedup_key(payload)).first()
    if event is None:
        # Claimed as saved but not there (the row was pruned, or a hand-made forward): save it.
        event, _ = inbox.record(Channel.RABBITMQ, payload)
    if event.processed_at is not None:
        metrics.evolution("webhook:skipped")
        return Received(SKIPPED, "already_processed")
    return _apply(event)


def _apply(event: IngestionEvent) -> Received:
    outcome = handlers.apply(event)
    if outcome == handlers.ALREADY_PROCESSED:
        metrics.evolution("webhook:skipped")
        return Received(SKIPPED, outcome)
    metrics.evolution("webhook:processed")
    return Received(PROCESSED, outcome)
