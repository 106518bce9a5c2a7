"""A number that sends nothing holds its whole due backlog, not one message per claim (worker.health_allows).

A claim that finds its number resting or restricted holds its message for a policy minute. Every other due message
of that number would meet the same verdict, each only after a release, a broker round trip and a claim of its own,
and again every policy minute for as long as the number rests: a large backlog would churn through the pipeline at
its number's pace while sending nothing. So the verdict holds them too, in Postgres, with the same WAITING line, up
to HOLD_BATCH at a time (the claim of a message beyond them holds the next batch).

Only outbox entries this transaction locks are held: an entry the relay is releasing right now is left to its claim,
which judges it as this one did.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from .. import lifecycle
from ..holds import hold_reason
from ..models import EventKind, OutboxEntry

HOLD_BATCH = 1_000


def hold_due_backlog(instance_id: int, until: datetime, detail: dict[str, Any], now: datetime) -> int:
    """Hold the number's entries due before `until` (each never past its deliverUntil), saying `detail`'s why;
    returns how many were held."""
    reason = hold_reason(EventKind.WAITING, detail, None)
    assert reason is not None
    with transaction.atomic():
        entries = list(
            OutboxEntry.objects.select_for_update(skip_locked=True, no_key=True, of=("self",))
            .filter(message__instance_id=instance_id, available_at__lt=until)
            .order_by("available_at")
            .values_list("pk", "message_id", "message__deliver_until")[:HOLD_BATCH]
        )
        if entries:
            holds = {str(message_id): (min(until, deadline), reason, detail) for _, message_id, deadline in entries}
            lifecycle.hold([pk for pk, _, _ in entries], holds, now)
    return len(entries)
