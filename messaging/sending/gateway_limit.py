"""How many sends a background lane keeps in progress at once: as many as Evolution answers promptly.

Evolution serves every lane's calls on one event loop. Against a gateway that takes 1 s to answer
because WhatsApp does, hundreds of calls in flight cost it nothing: they wait on WhatsApp, not on its
CPU. Against a gateway whose own CPU is the bottleneck, they queue, and an OTP's call waits behind all
of them: bench B3 read an OTP's call at 0.2-0.6 s with the bulk lanes' 384 threads each, 5-7 ms with
two processes per lane. So a utility or marketing lane process admits its sends (the task, from its
claim to its last write: lane worker threads doing anything at all) through one **adaptive limit**;
the OTP lane has none.

- A probe thread asks Evolution's cheapest route (`GET /`, no auth, no WhatsApp behind it) every
  `GATEWAY_PROBE_INTERVAL_MS` while the lane is sending, three times in a row, and keeps the median
  (a lane process runs niced among hundreds of threads: one slow answer may be its own scheduling; a
  queue at the gateway slows most of them, where the quickest of three would often find a gap in it). That round trip minus the **base** (the round trip with
  nothing of ours queued) is how long a call now waits in the gateway's queue before it is served:
  what an OTP's call would wait. The sendText calls' own times cannot say it, since WhatsApp's latency
  varies by seconds from one call to the next (a delay-based limit on them, Vegas or Gradient2, shrank
  to a dozen calls under a 0.3-3 s latency in a simulation; the probe sees no WhatsApp).
- The base is measured every `BASE_REFRESH_SECONDS` by holding new sends for `BASE_PAUSE_SECONDS` and
  probing then (the quickest probe since counts too): the quickest probe alone would be one taken
  behind our own queue when the lane starts busy, and the limit would keep that queue for good. The
  sends in progress go on meanwhile; the hold costs the lane under 1 % of its time.
- A wait above `GATEWAY_QUEUE_TARGET_MS` cuts the limit by a quarter, once per round (not again before
  the sends in progress at the cut have ended); at or under it, a limit that the lane filled grows by
  a tenth plus one, or doubles in **slow start**: from when the lane starts sending (or sends again
  after `BUSY_SECONDS` idle) until its first cut, as TCP's window does (from 4 to 384 in 7 probes).
- A task waits for its turn before it claims its message (sending.tasks), so a waiting thread holds no
  lease and no connection; after `TURN_MAX_WAIT_SECONDS` without one the task goes back to its queue.

The lane worker reserves no more tasks than its limit (`PrefetchFollower`, started by a worker bootstep in
pilot_status.celery): a worker reserving as many tasks as it has threads kept hundreds waiting for turns in
arrival order, so a project's blast reserved first held another project's marketing back (chaos R10: C's wait
5.1x its wait alone). With the prefetch at the limit, what waits stays in the outbox, where the relay's
fairness decides (R10: 1.15x).

Per process: each lane process has its own limit and probe (more processes, more calls; the probe
sees the queue they make together).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import requests
from django.conf import settings

from pilot_status import metrics

log = logging.getLogger(__name__)

DECREASE = 0.75
INCREASE = 1.1
# How often the gateway's round trip with nothing of ours queued is measured again, and how long new calls
# are held for it: the queue they made drains meanwhile (calls that wait on WhatsApp hold no CPU there).
BASE_REFRESH_SECONDS = 30.0
BASE_PAUSE_SECONDS = 0.2
# The probe runs only while the lane made a call this recently (an idle lane does not poll Evolution).
BUSY_SECONDS = 2.0
PROBE_TIMEOUT_SECONDS = 2.0
PROBES_PER_STEP = 3
# Well under RabbitMQ's consumer_timeout (30 min) for the reserved task the waiting thread holds.
TURN_MAX_WAIT_SECONDS = 60.0


def next_limit(limit: float, queued_seconds: float, target_seconds: float, filled: bool,
               minimum: float, maximum: float, slow_start: bool = False) -> float:
    """The limit after one probe: cut when calls queue past the target, grown when the lane filled it
    (doubled in slow start)."""
    if queued_seconds > target_seconds:
        return max(minimum, limit * DECREASE)
    if filled:
        return min(maximum, limit * 2 if slow_start else limit * INCREASE + 1)
    return limit


class AdaptiveLimit:
    """Admits at most `limit` calls at once; `observe` adjusts the limit from one probe's round trip."""

    def __init__(self, initial: float, minimum: float, maximum: float, target_seconds: float,
                 clock: Callable[[], float] = time.monotonic):
        self.limit = float(max(minimum, min(maximum, initial)))
        self.minimum, self.maximum, self.target_seconds = float(minimum), float(maximum), target_seconds
        self.in_flight = 0
        self.base: float | None = None  # the gateway's round trip with nothing of ours queued
        self._base_at = float("-inf")
        self._clock = clock
        self._changed = threading.Condition()
        self._filled = False  # whether the calls in flight reached the limit since the last probe
        self._paused = False
        self._last_call = float("-inf")
        # Slow start, as TCP's: a lane that starts sending (or sends again after BUSY_SECONDS idle) doubles
        # its limit on each probe that finds no queue, until the first cut. Growing by a tenth from the 4 it
        # started with (or from where a fast gateway had left it) took a lane 7-10 s to reach the ~380
        # sends a 3-s gateway with typing needs, more than the first round of sends itself (bench B8).
        self._slow_start = True
        # One cut per round: a cut shows in the gateway's queue only once the sends in progress when it
        # was made have ended (at 1 s of latency and 2 s of typing, 3 s later), and cutting again on
        # every probe meanwhile took a lane from 180 sends to 1 in two seconds (bench B8).
        self._ended = 0
        self._cut_allowed_at = 0
        # Told every new whole limit (PrefetchFollower.follow), under the limit's lock.
        self.on_change: Callable[[int], None] | None = None

    def acquire(self, timeout: float) -> bool:
        """Wait for a place among the calls in flight; False after `timeout` seconds without one."""
        deadline = self._clock() + timeout
        with self._changed:
            if not self.busy():
                self._slow_start = True
            while self._paused or self.in_flight >= int(self.limit):
                self._filled = self._filled or not self._paused
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._changed.wait(left)
            self.in_flight += 1
            self._filled = self._filled or self.in_flight >= int(self.limit)
            self._last_call = self._clock()
            return True

    def release(self) -> None:
        with self._changed:
            self.in_flight -= 1
            self._ended += 1
            self._changed.notify()

    def busy(self) -> bool:
        return self.in_flight > 0 or self._clock() - self._last_call < BUSY_SECONDS

    def needs_base(self) -> bool:
        return self._clock() - self._base_at >= BASE_REFRESH_SECONDS

    def hold(self, held: bool) -> None:
        """Hold new calls (for a base measurement) or let them go again."""
        with self._changed:
            self._paused = held
            if not held:
                self._changed.notify_all()

    def record_base(self, round_trip: float) -> None:
        self.base, self._base_at = round_trip, self._clock()

    def observe(self, round_trip: float) -> float:
        """One probe's round trip in seconds; returns the new limit."""
        if self.base is None or round_trip < self.base:
            self.base = round_trip
        with self._changed:
            before = self.limit
            queued = round_trip - self.base
            if queued > self.target_seconds and self._ended < self._cut_allowed_at:
                return before  # the last cut has not shown yet
            self.limit = next_limit(before, queued, self.target_seconds, self._filled, self.minimum, self.maximum,
                                    self._slow_start)
            if queued > self.target_seconds:
                self._slow_start = False
            if self.limit < before:
                self._cut_allowed_at = self._ended + self.in_flight
            self._filled = self.in_flight >= int(self.limit)
            if int(self.limit) > int(before):
                self._changed.notify_all()
            if int(self.limit) != int(before) and self.on_change is not None:
                self.on_change(int(self.limit))
            return self.limit


class PrefetchFollower:
    """Keeps a Celery consumer's prefetch (its `kombu.common.QoS`) at the limit, between 1 and `ceiling`
    (the worker's threads): the worker then reserves only the tasks it may start now. The QoS is changed
    "eventually", the thread-safe way Celery's autoscaler uses: the consumer's loop sends the new
    basic.qos; the tasks already reserved stay, and RabbitMQ sends no more until fewer are unacknowledged.
    Changes go by difference, since the consumer also moves the prefetch for the tasks it holds with an ETA."""

    def __init__(self, qos: Any, ceiling: int) -> None:
        self.qos, self.ceiling = qos, max(1, ceiling)
        self.current = int(qos.value)  # what the consumer (re)started with

    def follow(self, limit: int) -> None:
        target = max(1, min(self.ceiling, limit))
        change, self.current = target - self.current, target
        if change > 0:
            self.qos.increment_eventually(change)
        elif change < 0:
            self.qos.decrement_eventually(-change)


def follow_with_prefetch(lane: str, qos: Any, ceiling: int) -> AdaptiveLimit | None:
    """Called once by the lane worker's consumer when it starts: this lane's limit, with the worker's
    prefetch set to it from now on (None, prefetch untouched, for the OTP lane or with the limit off)."""
    limit = for_lane(lane)
    if limit is not None:
        follower = PrefetchFollower(qos, ceiling)
        with limit._changed:
            follower.follow(int(limit.limit))
            limit.on_change = follower.follow
    return limit


def probe_step(limit: AdaptiveLimit, probe: Callable[[], float | None],
               sleep: Callable[[float], None] = time.sleep) -> None:
    """One probe of a busy lane: a base measurement (new calls held meanwhile) when the last one is old,
    else a probe whose wait above the base adjusts the limit."""
    if limit.needs_base():
        limit.hold(True)
        try:
            sleep(BASE_PAUSE_SECONDS)
            round_trip = probe()
        finally:
            limit.hold(False)
        if round_trip is not None:
            limit.record_base(round_trip)
        return
    round_trip = probe()
    if round_trip is not None:
        before = limit.limit
        if limit.observe(round_trip) < before:
            metrics.evolution("gateway:limit_cut")


_lock = threading.Lock()
_limit: AdaptiveLimit | None = None


def for_lane(lane: str) -> AdaptiveLimit | None:
    """This process's limit for a background lane's calls (started with its probe on first use); None
    for the OTP lane, or when GATEWAY_ADAPTIVE_LIMIT is off."""
    global _limit
    if lane == "otp" or not settings.GATEWAY_ADAPTIVE_LIMIT:
        return None
    if _limit is None:
        with _lock:
            if _limit is None:
                limit = AdaptiveLimit(
                    settings.GATEWAY_LIMIT_INITIAL, 1, settings.GATEWAY_LIMIT_MAX,
                    settings.GATEWAY_QUEUE_TARGET_MS / 1000,
                )
                threading.Thread(target=_probe_forever, args=(limit,), name="gateway-probe", daemon=True).start()
                _limit = limit
    return _limit


def probe(session: requests.Session) -> float | None:
    """The median of PROBES_PER_STEP round trips of `GET /` (see the module's docstring)."""
    trips = [probe_once(session) for _ in range(PROBES_PER_STEP)]
    answered = sorted(trip for trip in trips if trip is not None)
    return answered[len(answered) // 2] if answered else None


def probe_once(session: requests.Session) -> float | None:
    """The round trip of `GET /` in seconds (its timeout when it timed out); None when Evolution is not
    reachable or answers oddly, which says nothing about its queue (the circuits handle that)."""
    started = time.monotonic()
    try:
        response = session.get(f"{settings.EVOLUTION_API_URL}/",
                               timeout=(settings.EVOLUTION_CONNECT_TIMEOUT, PROBE_TIMEOUT_SECONDS))
    except requests.Timeout:
        return PROBE_TIMEOUT_SECONDS
    except requests.RequestException:
        return None
    if response.status_code != 200:
        return None
    return time.monotonic() - started


# How often a busy lane logs its limit (what an operator reads to see why a lane sends as fast as it does).
REPORT_SECONDS = 10.0


def _probe_forever(limit: AdaptiveLimit) -> None:
    session = requests.Session()
    session.trust_env = False
    interval = settings.GATEWAY_PROBE_INTERVAL_MS / 1000
    trips: list[float] = []
    reported = time.monotonic()
    while True:
        time.sleep(interval)
        if not limit.busy():
            continue
        def timed() -> float | None:
            trip = probe(session)
            if trip is not None:
                trips.append(trip)
            return trip

        try:
            probe_step(limit, timed)
        except Exception:  # the probe must never die: without it the limit would stay where it is
            log.exception("gateway probe failed")
        if time.monotonic() - reported >= REPORT_SECONDS and trips:
            trips.sort()
            log.info("gateway limit %.1f (%d sends in progress); probe p50 %.1f ms, p90 %.1f ms, base %.1f ms",
                     limit.limit, limit.in_flight, 1000 * trips[len(trips) // 2], 1000 * trips[len(trips) * 9 // 10],
                     1000 * (limit.base or 0))
            trips, reported = [], time.monotonic()
