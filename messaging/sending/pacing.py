"""Per-instance send pacing: a token bucket the relay draws from before releasing a message.

The rate cap (the number's rate, decided by its sending policy: messaging.sending.policy.rate) bounds how
fast one WhatsApp number is asked to send, so the backlog that piles up during an outage or a
disconnect drains at that pace instead of as a thundering herd (docs/architecture.md, principle 5).

The bucket lives in Redis (one Lua call, atomic across relays). When Redis cannot be reached a
per-process bucket takes over: pacing stays on, it is just no longer shared between relays.

The relay paces releases, but a released task can wait in the lane's queue (up to RELAY_LANE_DEPTH
of them) while the workers are slower than the releases, and the workers then catch up faster than
the cap (bench B4 saw 23 calls/s per instance against 20). So the worker also takes a send slot
right before it calls Evolution (`send_slot`, the same rate and burst as a meter over the calls
themselves): the cap holds where WhatsApp sees it, and when the queue keeps pace it never waits.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from django.conf import settings

from pilot_status import metrics
from pilot_status.redis_backoff import RedisBackoff

_KEY = "ps:pacing:instance:{}"
# One call for every instance of a relay pass: KEYS are the buckets, ARGV is `now` followed by
# (rate, burst, want, debt) per key; returns how many each may send. `debt` is how far below empty
# the take may leave the bucket: an OTP's (`priority`), so that it never waits for the tokens the
# bulk lanes drew first; the bulk lanes pay it back, since they take nothing while the bucket is
# below empty.
_TAKE = """
local now = tonumber(ARGV[1])
local granted = {}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[4 * i - 2])
  local burst = tonumber(ARGV[4 * i - 1])
  local want = tonumber(ARGV[4 * i])
  local debt = tonumber(ARGV[4 * i + 1])
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1])
  local ts = tonumber(state[2])
  if tokens == nil then tokens = burst; ts = now end
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
  local take = math.max(0, math.min(math.floor(tokens + debt), want))
  tokens = tokens - take
  redis.call('HSET', key, 'tokens', tostring(tokens), 'ts', tostring(now))
  redis.call('EXPIRE', key, math.ceil((burst - tokens) / rate) + 60)
  granted[i] = take
end
return granted
"""


def burst_for(rate: float) -> int:
    # A slow instance must not get a burst bigger than a few seconds of its own pace.
    return max(1, min(settings.SEND_RATE_BURST, math.ceil(rate * 2)))


class _LocalBuckets:
    def __init__(self) -> None:
        self.buckets: dict[int, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def take(self, instance_id: int, rate: float, burst: int, want: int, now: float, debt: int = 0) -> int:
        with self.lock:
            tokens, ts = self.buckets.get(instance_id, (float(burst), now))
            tokens = min(burst, tokens + max(0.0, now - ts) * rate)
            granted = max(0, min(math.floor(tokens + debt), want))
            self.buckets[instance_id] = (tokens - granted, now)
            return granted


local_buckets = _LocalBuckets()
_redis = RedisBackoff("pacing on per-process buckets")
_scripts: dict[str, Any] = {}  # Lua source -> registered script


def _in_redis(source: str, keys: list[str], args: list[float]) -> Any:
    """Run a Lua script on the shared Redis; None when Redis is away (the caller falls back to this process)."""
    if not _redis.ready():
        return None
    try:
        client = metrics.redis()
        if source not in _scripts:
            _scripts[source] = client.register_script(source)
        return _scripts[source](keys=keys, args=args, client=client)
    except Exception as exc:
        _redis.failed(exc)
        return None


def take(instance_id: int, want: int, rate: float, priority: bool = False) -> int:
    """How many of `want` sends through this instance may be released now (0..want), at `rate` per second."""
    return take_many({instance_id: (want, rate)}, priority)[instance_id]


def take_many(wants: dict[int, tuple[int, float]], priority: bool = False) -> dict[int, int]:
    """`take` for several instances in one Redis round trip: {instance: (want, rate)} → granted.

    With `priority` (the OTP lane) a take may borrow up to one burst from the instance's future: an OTP
    sharing a number with a marketing backlog does not wait for the tokens that backlog drew first, and
    the number's pace still holds beyond one extra burst (the bulk lanes take nothing until it is repaid)."""
    asked = {iid: (want, rate) for iid, (want, rate) in wants.items() if want > 0}
    granted = {iid: 0 for iid in wants}
    if not asked:
        return granted
    now = time.time()
    ids = list(asked)
    args: list[float] = [now]
    for iid in ids:
        want, rate = asked[iid]
        args += [rate, burst_for(rate), want, burst_for(rate) if priority else 0]
    answer = _in_redis(_TAKE, [_KEY.format(iid) for iid in ids], args)
    if answer is not None:
        granted.update({iid: int(n) for iid, n in zip(ids, answer)})
        return granted
    for iid, (want, rate) in asked.items():
        burst = burst_for(rate)
        granted[iid] = local_buckets.take(iid, rate, burst, want, now, burst if priority else 0)
    return granted


# A generic cell rate algorithm: the key holds the theoretical arrival time (TAT) of the next call.
# A call may go `burst` emission intervals ahead of it; a later one reserves its slot and is told
# how long to wait for it, unless that is longer than ARGV[4] (then nothing is reserved); ARGV[5] is
# how many seconds further ahead a priority call (an OTP) may go. Seconds go back as text: Redis would
# truncate a Lua number to an integer.
_SLOT = """
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local borrow = tonumber(ARGV[5])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local wait = math.max(0, tat - tolerance - borrow - now)
if wait > max_wait then return tostring(-wait) end
redis.call('SET', KEYS[1], tostring(tat + interval), 'PX', math.ceil((tat + interval - now) * 1000) + 1000)
return tostring(wait)
"""
_SLOT_KEY = "ps:pacing:send:{}"
# Longer than this, a worker does not sleep for its slot: the message goes back to Postgres, due then.
SLOT_MAX_WAIT_SECONDS = 2.0


class _LocalSlots:
    def __init__(self) -> None:
        self.tats: dict[int, float] = {}
        self.lock = threading.Lock()

    def take(self, instance_id: int, interval: float, tolerance: float, max_wait: float, now: float,
             borrow: float = 0.0) -> float:
        with self.lock:
            tat = max(self.tats.get(instance_id, now), now)
            wait = max(0.0, tat - tolerance - borrow - now)
            if wait > max_wait:
                return -wait
            self.tats[instance_id] = tat + interval
            return wait


local_slots = _LocalSlots()
local_pairs = _LocalSlots()  # keyed by (instance, recipient); bounded by the recipients a process sent to


def send_slot(instance_id: int, rate: float, max_wait: float = SLOT_MAX_WAIT_SECONDS,
              priority: bool = False) -> float:
    """Reserve this instance's next send slot at `rate` per second: seconds to wait before calling Evolution (0: now).

    A negative answer reserves nothing: the slot is that many seconds away, more than `max_wait`.
    With `priority` (an OTP) the call may go up to one burst of intervals ahead of the slots the
    others reserved, which its call moves one interval later: the relay's bucket borrows the same way.
    """
    interval = 1.0 / rate
    tolerance = (burst_for(rate) - 1) * interval
    borrow = burst_for(rate) * interval if priority else 0.0
    now = time.time()
    answer = _in_redis(_SLOT, [_SLOT_KEY.format(instance_id)], [now, interval, tolerance, max_wait, borrow])
    if answer is not None:
        return float(answer)
    return local_slots.take(instance_id, interval, tolerance, max_wait, now, borrow)


_PAIR_KEY = "ps:pacing:pair:{}:{}"


def pair_slot(instance_id: int, phone: str, interval: float, max_wait: float = SLOT_MAX_WAIT_SECONDS) -> float:
    """Reserve the next send from this number to this recipient, at most one per `interval` seconds (Meta's pair
    rate for an official number): seconds to wait (0: now), or, negative, how far away it is (nothing reserved)."""
    now = time.time()
    answer = _in_redis(_SLOT, [_PAIR_KEY.format(instance_id, phone)], [now, interval, 0.0, max_wait, 0.0])
    if answer is not None:
        return float(answer)
    return local_pairs.take(hash((instance_id, phone)), interval, 0.0, max_wait, now)


def reset_local() -> None:
    """Forget this process's fallback buckets and try Redis again at once."""
    global local_buckets, local_slots, local_pairs
    _redis.reset()
    local_buckets = _LocalBuckets()
    local_slots = _LocalSlots()
    local_pairs = _LocalSlots()
