"""Rate limit per API key: a token bucket shared by every web process through Redis.

When Redis is unreachable the limit degrades to a bucket per process (each process allows the
full rate), so an outage of Redis never turns into an outage of the API (issue 3; docs/architecture.md, principle 1).

A process takes tokens from the shared bucket a few at a time when the rate allows it: up to
LEASE_SECONDS of the key's rate (at most LEASE_MAX tokens), spent by its next requests within
LEASE_SECONDS, after which the ones left are dropped. Every token still comes out of the shared
bucket, so the limit is never exceeded; at its edge it can refuse up to one lease per process
early. A key at the default 50/s takes two at a time; a busy key with a high limit no longer costs
a Redis round trip per request (bench B1).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from pilot_status import metrics

log = logging.getLogger(__name__)

LEASE_SECONDS = 0.05
LEASE_MAX = 20

# KEYS[1] bucket; ARGV rate/s, burst, now (s), tokens wanted. Returns {granted, wait_ms}: up to the
# tokens wanted, at least one when any is there. Atomic in Redis, so concurrent processes never
# both spend the last token.
_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local wanted = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local granted = 0
local wait = 0
if tokens >= 1 then
  granted = math.min(wanted, math.floor(tokens))
  tokens = tokens - granted
else
  wait = math.ceil((1 - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {granted, wait}
"""


def lease_size(rate: float, burst: int, lease_seconds: float | None = None) -> int:
    return max(1, min(LEASE_MAX, burst, int(rate * (LEASE_SECONDS if lease_seconds is None else lease_seconds))))


class _Leases:
    """Tokens this process took from the shared bucket and has not spent yet, per key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left: dict[str, tuple[int, float]] = {}  # key → (tokens, spend before: monotonic)

    def spend(self, key: str) -> bool:
        with self._lock:
            left, until = self._left.get(key, (0, 0.0))
            if left < 1 or time.monotonic() >= until:
                return False
            self._left[key] = (left - 1, until)
            return True

    def keep(self, key: str, tokens: int, lease_seconds: float | None = None) -> None:
        with self._lock:
            self._left[key] = (tokens, time.monotonic() + (LEASE_SECONDS if lease_seconds is None else lease_seconds))


class _LocalBuckets:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, float]] = {}

    def take(self, key: str, rate: float, burst: int, now: float) -> tuple[bool, float]:
        with self._lock:
            tokens, at = self._state.get(key, (float(burst), now))
            tokens = min(burst, tokens + max(0.0, now - at) * rate)
            if tokens >= 1:
                self._state[key] = (tokens - 1, now)
                return True, 0.0
            self._state[key] = (tokens, now)
            return False, (1 - tokens) / rate


_local = _LocalBuckets()
_leases = _Leases()
_script: Any = None


def take_token(key: str, rate: float, burst: int, lease_seconds: float | None = None) -> tuple[bool, float]:
    """(allowed, seconds to wait). `lease_seconds` (default LEASE_SECONDS): how long this process may
    keep tokens it took ahead (at most LEASE_MAX of them); longer saves round trips for a steady
    caller whose requests come further apart (Evolution's webhooks)."""
    global _script
    if _leases.spend(key):
        return True, 0.0
    now = time.time()
    try:
        if _script is None:
            _script = metrics.redis().register_script(_BUCKET_LUA)
        granted, wait_ms = _script(keys=[f"ps:ratelimit:{key}"], args=[rate, burst, now, lease_size(rate, burst, lease_seconds)])
        if int(granted) > 1:
            _leases.keep(key, int(granted) - 1, lease_seconds)
        return int(granted) >= 1, int(wait_ms) / 1000
    except Exception as exc:
        log.debug("rate limit falling back to this process: %s", exc)
        return _local.take(key, rate, burst, now)


class ApiKeyRateThrottle(BaseThrottle):
    def allow_request(self, request: Request, view: Any) -> bool:
        key = getattr(request.auth, "pk", None)
        if key is None:
            return True
        allowed, self._wait = take_token(f"key:{key}", settings.RATE_LIMIT_PER_SECOND, settings.RATE_LIMIT_BURST)
        return allowed

    def wait(self) -> float | None:
        return max(1.0, math.ceil(getattr(self, "_wait", 1.0)))
