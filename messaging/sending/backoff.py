"""Retry timing: exponential backoff with jitter, capped, never past deliverUntil."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

BASE_SECONDS = 5.0
FACTOR = 3.0  # 5 s, 15 s, 45 s, 2¼ min, then the cap
CAP_SECONDS = 300.0
# ±20 %: enough to spread a herd of retries that failed together over several seconds.
JITTER = 0.2


def unjittered_delay_for(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based), before the jitter."""
    return min(BASE_SECONDS * FACTOR ** max(attempt - 1, 0), CAP_SECONDS)


def delay_for(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based)."""
    raw = unjittered_delay_for(attempt)
    spread = (rng or random).uniform(-JITTER, JITTER)
    return max(1.0, raw * (1 + spread))


# When the backoff would pass deliverUntil, one last attempt is made shortly before it: the client
# gave us until then, so a message fails EXPIRED in deliverUntil's last seconds (docs/api.md: the
# deadline passed before a send succeeded), not at the failure before. The last attempts of messages
# sharing a deliverUntil are spread over its final LAST_CHANCE_WINDOW; as that is shorter than the
# shortest backoff, a failed last attempt leaves too little time for another one and the message
# expires.
LAST_CHANCE_MARGIN = timedelta(seconds=1)
LAST_CHANCE_WINDOW = timedelta(seconds=BASE_SECONDS * (1 - JITTER))


def next_attempt_at(
    attempt: int, now: datetime, deliver_until: datetime, rng: random.Random | None = None
) -> datetime | None:
    """When to try again, or None when no further attempt fits before deliverUntil."""
    due = now + timedelta(seconds=delay_for(attempt, rng))
    latest = deliver_until - LAST_CHANCE_MARGIN
    if due <= latest:
        return due
    if latest - now < timedelta(seconds=BASE_SECONDS):
        return None  # a last attempt was made, or there is no time for one
    return latest - LAST_CHANCE_WINDOW * (rng or random).random()
