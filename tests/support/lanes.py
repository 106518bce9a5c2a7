"""Lane queues as the broker sees them, for tests that publish without a worker to take the tasks."""

from __future__ import annotations

from messaging import dispatch
from tests.support.simulator import wait_until


def wait_until_the_broker_counts(lane: str, depth: int) -> None:
    """A publish reaches its queue after the relay's pass returns (no publisher confirms; a lost task is
    redispatched by the reconciler), so the queue's count can lag a moment behind the release."""
    wait_until(lambda: dispatch.lane_depths((lane,))[lane] >= depth, timeout=10, interval=0.02,
               message=f"the broker to count {depth} tasks in {lane}")
