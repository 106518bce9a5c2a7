"""Rate limit per API key: a token bucket shared by every web process through Redis.

When Redis is unreachable the limit degrades to a bucket per process (each process allows the
full rate), so an outage of Redis never turns into an outage of the API (issue 3, design.md §1).
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

# KEYS[1] bucket; ARGV rate/s, burst, now (s). Returns {allowed, wait_ms}. Atomic in Redis, so
# concurrent processes never both spend the last token.
_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local allowed = 0
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = math.ceil((1 - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, wait}
"""


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
_script: Any = None


def take_token(key: str, rate: float, burst: int) -> tuple[bool, float]:
    """(allowed, seconds to wait)."""
    global _script
    now = time.time()
    try:
        if _script is None:
            _script = metrics.redis().register_script(_BUCKET_LUA)
        allowed, wait_ms = _script(keys=[f"ps:ratelimit:{key}"], args=[rate, burst, now])
        return bool(allowed), int(wait_ms) / 1000
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
