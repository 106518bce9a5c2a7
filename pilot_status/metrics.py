"""Counters in Redis (seeds B "Observability"): `ps:metrics:evolution:*` and `ps:metrics:messages:*`.

Counting must never break the work it counts: when Redis is down, counts are lost, work is not.
"""

from __future__ import annotations

import logging
from typing import Any

from django_redis import get_redis_connection

log = logging.getLogger(__name__)

EVOLUTION = "ps:metrics:evolution:"
MESSAGES = "ps:metrics:messages:"


def redis() -> Any:
    return get_redis_connection("default")


def incr(name: str, amount: int = 1) -> None:
    try:
        redis().incrby(name, amount)
    except Exception as exc:  # Redis down: see module docstring.
        log.debug("metric %s not counted: %s", name, exc)


def evolution(name: str, amount: int = 1) -> None:
    incr(EVOLUTION + name, amount)


def messages(name: str, amount: int = 1) -> None:
    incr(MESSAGES + name, amount)


def read_all() -> dict[str, int]:
    """Every counter, for the metrics endpoints. Raises when Redis is unreachable."""
    client = redis()
    keys = sorted(k.decode() if isinstance(k, bytes) else k for k in client.scan_iter(match="ps:metrics:*", count=500))
    values = client.mget(keys) if keys else []
    return {key: int(value or 0) for key, value in zip(keys, values)}
