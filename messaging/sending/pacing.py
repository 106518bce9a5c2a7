"""Per-instance send pacing: a token bucket the relay draws from before releasing a message.

The rate cap (`SEND_RATE_PER_INSTANCE`, or the instance's own `send_rate_per_second`) bounds how
fast one WhatsApp number is asked to send, so the backlog that piles up during an outage or a
disconnect drains at that pace instead of as a thundering herd (seeds A weak points, design §5).

The bucket lives in Redis (one Lua call, atomic across relays). When Redis cannot be reached a
per-process bucket takes over: pacing stays on, it is just no longer shared between relays.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from django.conf import settings

from pilot_status import metrics

log = logging.getLogger(__name__)

_KEY = "ps:pacing:instance:{}"
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil then tokens = burst; ts = now end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local take = math.min(math.floor(tokens), want)
tokens = tokens - take
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return take
"""


def rate_for(instance_rate: float | None) -> float:
    rate = instance_rate if instance_rate else settings.SEND_RATE_PER_INSTANCE
    return max(rate, 0.01)


def burst_for(rate: float) -> int:
    # A slow instance must not get a burst bigger than a few seconds of its own pace.
    return max(1, min(settings.SEND_RATE_BURST, math.ceil(rate * 2)))


class _LocalBuckets:
    def __init__(self) -> None:
        self.buckets: dict[int, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def take(self, instance_id: int, rate: float, burst: int, want: int, now: float) -> int:
        with self.lock:
            tokens, ts = self.buckets.get(instance_id, (float(burst), now))
            tokens = min(burst, tokens + max(0.0, now - ts) * rate)
            granted = min(int(tokens), want)
            self.buckets[instance_id] = (tokens - granted, now)
            return granted


local_buckets = _LocalBuckets()
_script: Any = None
_redis_down_until = 0.0


def take(instance_id: int, want: int, instance_rate: float | None = None) -> int:
    """How many of `want` sends through this instance may be released now (0..want)."""
    global _script, _redis_down_until
    if want <= 0:
        return 0
    rate = rate_for(instance_rate)
    burst = burst_for(rate)
    now = time.time()
    if time.monotonic() >= _redis_down_until:
        try:
            client = metrics.redis()
            if _script is None:
                _script = client.register_script(_TAKE)
            return int(_script(keys=[_KEY.format(instance_id)], args=[rate, burst, now, want], client=client))
        except Exception as exc:
            _redis_down_until = time.monotonic() + 5.0
            log.warning("pacing on per-process buckets: Redis unavailable (%s)", exc.__class__.__name__)
    return local_buckets.take(instance_id, rate, burst, want, now)


def reset_local() -> None:
    """Forget this process's fallback buckets and try Redis again at once."""
    global _redis_down_until, local_buckets
    _redis_down_until = 0.0
    local_buckets = _LocalBuckets()
