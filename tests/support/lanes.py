"""Lane queues as the broker sees them, for tests that publish without a worker to take the tasks."""

from __future__ import annotations

import time

from messaging import dispatch


def wait_until_the_broker_counts(lane: str, depth: int) -> None:
    """A publish reaches its queue after the relay's pass returns (no publisher confirms; a lost task is
    redispatched by the reconciler), so the queue's count can lag a moment behind the release."""
    deadline = time.monotonic() + 10
    while dispatch.lane_depths((lane,))[lane] < depth:
        assert time.monotonic() < deadline, f"the broker never counted {depth} tasks in {lane}"
        time.sleep(0.02)
