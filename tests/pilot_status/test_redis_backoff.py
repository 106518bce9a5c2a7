"""The clock every Redis user's fallback shares (pilot_status.redis_backoff)."""

from __future__ import annotations

import logging

from pilot_status.redis_backoff import RedisBackoff


def test_after_a_failure_redis_is_left_alone_for_a_while_and_the_fallback_is_named(caplog):
    backoff = RedisBackoff("pacing on per-process buckets", seconds=60)
    assert backoff.ready()
    with caplog.at_level(logging.WARNING):
        backoff.failed(ConnectionError("refused"))
    assert not backoff.ready()
    assert "pacing on per-process buckets: Redis unavailable (ConnectionError)" in caplog.text
    backoff.reset()
    assert backoff.ready()


def test_the_pause_ends_by_itself():
    backoff = RedisBackoff("x", seconds=0)
    backoff.failed(TimeoutError())
    assert backoff.ready()
