"""The lease a claim of a message holds (docs/architecture.md, principle 3): how long it is taken for, whether it
still holds, and what a step answers when it finds it gone.

sending.worker takes it with the claim, sending.lost_answer renews it after a check, and the reconciler hands back
the messages whose lease ran out.
"""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from ..models import Message
from . import budget

# What a step answers when the message's lease was no longer its own: the reconciler took it back, or another
# claim holds it.
LEASE_LOST = "lease_lost"


def lease_seconds() -> float:
    """The lease a claim takes: SEND_LEASE_SECONDS, and never less than the claim's worst case
    (settings refuses a shorter one at start-up; this also holds for settings changed at run time)."""
    needed = budget.lease_seconds_needed(
        settings.EVOLUTION_CONNECT_TIMEOUT, settings.EVOLUTION_READ_TIMEOUT, settings.TYPING_DELAY_MAX_MS
    )
    return float(max(settings.SEND_LEASE_SECONDS, needed))


def lease_left(message: Message) -> bool:
    return message.lease_expires_at is not None and timezone.now() < message.lease_expires_at
