"""Retry timing: exponential backoff with jitter, capped, never past deliverUntil (seeds A-B)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

BASE_SECONDS = 5.0
FACTOR = 3.0  # 5 s, 15 s, 45 s, 2¼ min, then the cap
CAP_SECONDS = 300.0
# ±20 %: enough to spread a herd of retries that failed together over several seconds.
JITTER = 0.2


def delay_for(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based)."""
    raw = min(BASE_SECONDS * FACTOR ** max(attempt - 1, 0), CAP_SECONDS)
    spread = (rng or random).uniform(-JITTER, JITTER)
    return max(1.0, raw * (1 + spread))


def next_attempt_at(
    attempt: int, now: datetime, deliver_until: datetime, rng: random.Random | None = None
) -> datetime | None:
    """When to try again, or None when no further attempt fits before deliverUntil."""
    due = now + timedelta(seconds=delay_for(attempt, rng))
    if due >= deliver_until:
        return None
    return due
