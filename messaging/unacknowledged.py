"""Sends WhatsApp never acknowledged (issue 47 §6): Evolution answered 201 and the message is SENT, but no
SERVER_ACK (nor any later receipt) comes, while the instance says it is connected. Left alone it would look like a
send that is merely slow; on a number WhatsApp is throttling it is the first sign of trouble.

The status sync pass (messaging.status_sync) flags every message SENT for ACK_TIMEOUT_SECONDS without a receipt
(`flag`: `unacknowledged_at` and one UNACKNOWLEDGED timeline line; callbacks.derive turns the flag into a
`message.unacknowledged` callback) and asks Evolution about the flagged ones before any other. A receipt that comes
later supersedes the flag: the message moves on, `unacknowledged` reads false, and `unacknowledged_at` stays as the
record that it was late. The per-instance count (`by_instance`, `count_for`; the gauge
`pilot_status_unacknowledged_sends`) is what a health governor reads: the recent sends of each number that are
still unacknowledged.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, QuerySet
from django.utils import timezone

from . import lifecycle
from .models import Instance, Message, Status

# The sends a count looks at: the last day's. An older unacknowledged send says little about the number today, and
# status sync stops asking about it after STATUS_SYNC_GIVE_UP_AFTER_HOURS anyway.
WINDOW = timedelta(hours=24)
# At most this many flagged per pass (the oldest sends first); the next pass goes on.
FLAG_BATCH = 1000


def timeout() -> int:
    return int(settings.ACK_TIMEOUT_SECONDS)


def flag(now: datetime | None = None, limit: int = FLAG_BATCH) -> int:
    """Flag the overdue sends not flagged yet (lifecycle.flag_unacknowledged); how many."""
    return lifecycle.flag_unacknowledged(now or timezone.now(), timeout(), limit)


def _flagged(window: timedelta, now: datetime | None = None) -> QuerySet[Message]:
    since = (now or timezone.now()) - window
    # Written as msg_unacknowledged's condition, so that the count reads that partial index only.
    return Message.objects.filter(status=Status.SENT, unacknowledged_at__isnull=False, sent_at__gte=since)


def by_instance(window: timedelta = WINDOW, now: datetime | None = None) -> dict[int, int]:
    """Instance id → how many of its sends of the last `window` WhatsApp still has not acknowledged (none: absent)."""
    rows = _flagged(window, now).values("instance_id").annotate(n=Count("id")).values_list("instance_id", "n")
    return {instance_id: n for instance_id, n in rows}


def by_instance_name(window: timedelta = WINDOW) -> dict[str, int]:
    """As `by_instance`, by the instance's name (the metric's label)."""
    counts = by_instance(window)
    names = dict(Instance.objects.filter(pk__in=counts).values_list("pk", "name"))
    return {names[pk]: n for pk, n in counts.items() if pk in names}


def count_for(instance: Instance, window: timedelta = WINDOW) -> int:
    """How many of this instance's sends of the last `window` WhatsApp still has not acknowledged."""
    return _flagged(window).filter(instance=instance).count()
