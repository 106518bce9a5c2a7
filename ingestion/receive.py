"""The one way in for an Evolution event: lock, inbox, business logic (seeds.md B)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pilot_status import metrics

from . import handlers, inbox
from .models import Channel, IngestionEvent

log = logging.getLogger(__name__)

LOCK_PREFIX = "ps:lock:evolution:"
# Both channels usually deliver within milliseconds of each other; two minutes covers a slow
# handler without leaving a crashed holder's lock around for long (seeds B).
LOCK_TTL_SECONDS = 120

PROCESSED = "processed"
SKIPPED = "skipped"
LOCKED = "locked"


@contextmanager
def event_lock(key: str) -> Iterator[bool]:
    """Redis SET NX as a fast first filter. Yields False when someone else holds it.

    When Redis is unreachable it yields True: the inbox's unique key and the row lock in
    handlers.apply still guarantee one effect (design.md §3: the lock never stops work).
    """
    client = None
    try:
        client = metrics.redis()
        acquired = bool(client.set(LOCK_PREFIX + key, "1", nx=True, ex=LOCK_TTL_SECONDS))
    except Exception as exc:
        log.debug("event lock unavailable (%s); relying on the inbox", exc)
        client, acquired = None, True
    try:
        yield acquired
    finally:
        if client is not None and acquired:
            try:
                client.delete(LOCK_PREFIX + key)
            except Exception:
                pass


def receive_webhook(payload: dict[str, Any]) -> str:
    """An event from Evolution's webhook: store it (channel WEBHOOK) and apply it once."""
    key = inbox.dedup_key(payload)
    with event_lock(key) as acquired:
        if not acquired:
            metrics.evolution("webhook:skipped")
            return LOCKED
        event, created = inbox.record(Channel.WEBHOOK, payload)
        if not created and event.processed_at is not None:
            metrics.evolution("webhook:skipped")
            return SKIPPED
        handlers.apply(event)
    metrics.evolution("webhook:processed")
    return PROCESSED


def receive_forwarded(payload: dict[str, Any]) -> str:
    """An event already saved by the consumer or the reconciler: run the business logic only."""
    key = inbox.dedup_key(payload)
    event = IngestionEvent.objects.filter(dedup_key=key).first()
    if event is None:
        # Claimed as saved but not there (e.g. saved in a transaction that rolled back): save it.
        event, _ = inbox.record(Channel.RABBITMQ, payload)
    if event.processed_at is not None:
        metrics.evolution("webhook:skipped")
        return SKIPPED
    handlers.apply(event)
    metrics.evolution("webhook:processed")
    return PROCESSED
