"""The one way in for an Evolution event: lock, inbox, business logic (docs/internals.md, "Path of an event")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pilot_status import metrics

from . import handlers, inbox
from pilot_status.database import checking_connection
from .locks import event_lock
from .models import Channel

log = logging.getLogger(__name__)

PROCESSED = "processed"
SKIPPED = "skipped"


@dataclass(frozen=True)
class Received:
    status: str  # PROCESSED or SKIPPED: what the webhook answers
    reason: str  # the handler's outcome, or why it was skipped


def receive_webhook(payload: dict[str, Any]) -> Received:
    """An event from Evolution's webhook: store it (channel WEBHOOK) and apply it once.

    Database errors propagate (the view answers 503 so that Evolution retries).
    """
    with event_lock(inbox.dedup_key(payload), skipped_counter="webhook:skipped") as hold:
        if hold.done:  # the other channel (or an earlier POST) processed it; counted by the lock
            return Received(SKIPPED, handlers.ALREADY_PROCESSED)
        if not hold:
            # The other channel (or a duplicate POST) holds it right now and will finish it;
            # if that holder dies, its copy is redelivered or the reconciler picks it up.
            return _skipped("in_progress_elsewhere", hold.count)
        # A new event is stored and applied in one transaction (one commit); a copy of one
        # already processed ends at its first statement.
        outcome = checking_connection(lambda: handlers.ingest(Channel.WEBHOOK, payload))
        if outcome != handlers.WAITING:  # committed and processed: the other copy may skip it
            hold.finish()
        return _received(outcome, hold.count)


def receive_forwarded(payload: dict[str, Any]) -> Received:
    """An event already saved by the consumer or the reconciler: run the business logic only.

    No lock here: the forwarding consumer holds it while it waits for this answer.
    """
    key = inbox.dedup_key(payload)
    outcome = checking_connection(lambda: handlers.apply_saved(key, payload))
    if outcome is None:
        # Claimed as saved but not there (the row was pruned, or a hand-made forward): save it.
        outcome = handlers.ingest(Channel.RABBITMQ, payload)
    return _received(outcome, metrics.evolution)


def _received(outcome: str, count: Callable[[str], None]) -> Received:
    if outcome == handlers.ALREADY_PROCESSED:
        return _skipped(outcome, count)
    count("webhook:processed")
    return Received(PROCESSED, outcome)


def _skipped(reason: str, count: Callable[[str], None]) -> Received:
    count("webhook:skipped")
    return Received(SKIPPED, reason)
