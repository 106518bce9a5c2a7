"""What holds a queued message back, as one comparable string: lifecycle.requeue writes a WAITING line only when
a message's reason changes, and the relay's holds (messaging.sending.human_pace) use the same key."""

from __future__ import annotations

from typing import Any

from .models import EventKind


def hold_reason(kind: str, detail: dict[str, Any], extra_update: dict[str, Any] | None) -> str | None:
    """What holds a message back as one comparable string (why, and the instance or circuit it concerns); None
    when a requeue is no hold: a retry uses an attempt, and a recovery is no wait."""
    if kind != EventKind.WAITING or "attempts" in (extra_update or {}):
        return None
    return "|".join(str(detail.get(key, "")) for key in ("why", "instance", "circuit"))[:200]
