"""The background lanes' adaptive limit on calls in flight at Evolution (messaging.sending.gateway_limit).

Plain functions and one object: no database. The two models at the end put the limit in front of the
two gateways it must tell apart, one whose CPU is the bottleneck (each call queued behind the others)
and one that only waits on WhatsApp, and show where the limit settles for each.
"""

from __future__ import annotations

import threading

import pytest
from kombu.common import QoS

from messaging.sending import gateway_limit
from messaging.sending.gateway_limit import AdaptiveLimit, PrefetchFollower, next_limit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_queueing_past_the_target_cuts_the_limit_by_a_quarter_down_to_the_minimum() -> None:
    assert next_limit(100, 0.050, 0.010, True, 1, 1024) == 75
    assert next_limit(100, 0.050, 0.010, False, 1, 1024) == 75  # cut whether or not it was filled
    assert next_limit(1.2, 0.050, 0.010, True, 1, 1024) == 1


def test_a_filled_limit_grows_while_nothing_queues_and_an_unused_one_stays() -> None:
    assert next_limit(100, 0.002, 0.010, True, 1, 1024) == pytest.approx(111)
    assert next_limit(100, 0.002, 0.010, False, 1, 1024) == 100
    assert next_limit(1000, 0.0, 0.010, True, 1, 1024) == 1024


def test_slow_start_doubles_a_filled_limit_until_the_first_cut_then_it_grows_by_a_tenth() -> None:
    assert next_limit(100, 0.002, 0.010, True, 1, 1024, slow_start=True) == 200
    assert next_limit(100, 0.002, 0.010, False, 1, 1024, slow_start=True) == 100  # not filled: stays
    assert next_limit(800, 0.002, 0.010, True, 1, 1024, slow_start=True) == 1024
    limit = AdaptiveLimit(4, 1, 1024, 0.003)
    limit.base = 0.001
    for expected in (8, 16, 32):
        limit._filled = True  # noqa: SLF001 - the lane filled it
        assert limit.observe(0.002) == expected
    assert limit.observe(0.050) == 24  # queued: cut, and slow start is over
    limit._filled = True  # noqa: SLF001
    assert limit.observe(0.002) == pytest.approx(27.4)


def test_a_lane_that_sends_again_after_an_idle_spell_starts_slow_again() -> None:
    clock = Clock()
    limit = AdaptiveLimit(8, 1, 1024, 0.003, clock=clock)
    limit.base = 0.001
    assert limit.acquire(0)  # the lane starts sending
    assert limit.observe(0.050) == 6  # cut: slow start is over
    limit._filled = True  # noqa: SLF001
    assert limit.observe(0.002) == pytest.approx(7.6)  # busy: by a tenth
    limit.release()
    clock.now += gateway_limit.BUSY_SECONDS
    assert limit.acquire(0)  # the first call after the idle spell
    limit._filled = True  # noqa: SLF001
    assert limit.observe(0.002) == pytest.approx(15.2)


def test_a_cut_waits_for_the_sends_in_progress_at_it_to_end_before_the_next() -> None:
    limit = AdaptiveLimit(40, 1, 100, 0.003)
    limit.base = 0.001
    for _ in range(8):
        assert limit.acquire(0)
    assert limit.observe(0.050) == 30  # queued: cut
    assert limit.observe(0.050) == 30  # the eight sends in progress at the cut have not ended
    for _ in range(7):
        limit.release()
    assert limit.observe(0.050) == 30
    limit.release()
    assert limit.observe(0.050) == 22.5  # they have now: the next cut


def test_at_most_limit_calls_are_admitted_and_a_release_admits_the_next() -> None:
    limit = AdaptiveLimit(2, 1, 10, 0.01)
    assert limit.acquire(0.01) and limit.acquire(0.01)
    assert not limit.acquire(0.05)  # a third waits its timeout out
    admitted = []
    waiter = threading.Thread(target=lambda: admitted.append(limit.acquire(5)))
    waiter.start()
    limit.release()
    waiter.join(5)
    assert admitted == [True] and limit.in_flight == 2


def test_a_grown_limit_wakes_the_waiting_threads() -> None:
    limit = AdaptiveLimit(1, 1, 10, 0.01)
    assert limit.acquire(0.01)
    admitted = []
    waiter = threading.Thread(target=lambda: admitted.append(limit.acquire(5)))
    waiter.start()
    while not limit._filled:  # noqa: SLF001 - the waiter has found the limit full
        pass
    assert limit.observe(0.001) == 2  # nothing queued, the limit was filled: it grows (doubled: slow start)
    waiter.join(5)
    assert admitted == [True]


def test_the_workers_prefetch_follows_the_whole_limit_between_one_and_its_threads() -> None:
    # given: a consumer's QoS as Celery's Tasks step makes it (384 threads × 1), and a limit of 4
    sent: list[int] = []
    qos = QoS(lambda prefetch_count: sent.append(prefetch_count), 384)
    limit = AdaptiveLimit(4, 1, 1024, 0.01)
    limit._slow_start = False  # noqa: SLF001 - past its slow start: grown by a tenth plus one
    follower = PrefetchFollower(qos, 384)
    follower.follow(int(limit.limit))
    limit.on_change = follower.follow
    assert qos.update() == 4 and sent == [4]  # the consumer's loop applies it

    # when: the limit grows (filled, nothing queued), then is cut
    limit._filled = True  # noqa: SLF001 - the lane filled it
    limit.observe(0.0)  # 4 → 5.4
    assert qos.value == 5
    limit.observe(1.0)  # 5.4 → 4.05: a fractional change below a whole one moves nothing
    assert qos.value == 4

    # then: an ETA task's hold (the consumer's own increment) is kept across a change
    qos.increment_eventually(1)
    limit._filled = True  # noqa: SLF001
    limit.observe(0.0)  # 4.05 → 5.455
    assert qos.value == 6
    # and the prefetch stays within 1 and the threads whatever the limit says
    follower.follow(5000)
    assert qos.value == 385
    follower.follow(0)
    assert qos.value == 1 + 1  # 1, plus the ETA task's hold


def test_the_base_is_measured_with_new_calls_held_then_lowered_by_any_quicker_probe() -> None:
    clock = Clock()
    limit = AdaptiveLimit(4, 1, 10, 0.01, clock=clock)
    assert limit.acquire(0)
    held_during_probe = []

    def probe() -> float:
        held_during_probe.append(not limit.acquire(0))  # a new call waits while the base is measured
        return 0.004

    assert limit.needs_base()
    gateway_limit.probe_step(limit, probe, sleep=lambda _: None)
    assert held_during_probe == [True] and limit.base == 0.004 and not limit.needs_base()
    assert limit.acquire(0)  # and goes once it is
    limit.observe(0.003)
    assert limit.base == 0.003
    clock.now += gateway_limit.BASE_REFRESH_SECONDS
    assert limit.needs_base()


def test_an_idle_lane_is_not_busy_and_does_not_probe() -> None:
    clock = Clock()
    limit = AdaptiveLimit(4, 1, 10, 0.01, clock=clock)
    assert not limit.busy()
    assert limit.acquire(0)
    assert limit.busy()
    limit.release()
    clock.now += gateway_limit.BUSY_SECONDS + 1
    assert not limit.busy()


def settle(limit: AdaptiveLimit, queued_for: float, probes: int = 600) -> float:
    """The probe thread's loop against a model gateway: the lane fills its limit, then one probe; a probe
    waits `queued_for(calls in flight)` beyond a 2 ms round trip, except while new calls are held (the
    queue drains then)."""
    clock = Clock()
    limit._clock = clock  # noqa: SLF001 - the model's time

    def probe() -> float:
        return 0.002 + (0 if limit._paused else queued_for(limit.in_flight))  # noqa: SLF001

    for _ in range(probes):
        while limit.acquire(0):
            pass
        gateway_limit.probe_step(limit, probe, sleep=lambda _: None)
        for _ in range(limit.in_flight):
            limit.release()
        clock.now += 0.1
    return limit.limit


def test_in_front_of_a_gateway_whose_cpu_is_the_bottleneck_the_limit_keeps_its_queue_near_the_target() -> None:
    # Each call takes 2 ms of the gateway's one CPU: a probe waits for every call in flight.
    limit = AdaptiveLimit(16, 1, 1024, 0.010)
    settled = settle(limit, lambda in_flight: in_flight * 0.002)
    assert 2 <= settled <= 8  # about target / service time (5); 384 threads would queue 0.77 s


def test_in_front_of_a_gateway_that_waits_on_whatsapp_the_limit_grows_to_what_the_lane_needs() -> None:
    # Calls wait seconds on WhatsApp, not on the gateway's CPU: the probe never queues.
    limit = AdaptiveLimit(16, 1, 1024, 0.010)
    assert settle(limit, lambda in_flight: 0.0, probes=60) == 1024


def test_a_lane_starting_in_front_of_a_gateway_that_waits_on_whatsapp_reaches_its_threads_within_a_second() -> None:
    # B8 at 3 s of latency with typing: ~380 sends in flight are what 384 threads can do. Grown by a tenth
    # plus one from 4, that took 35 probes with nothing queued (3.5 s at best, 7-10 s on a busy host).
    limit = AdaptiveLimit(4, 1, 1024, 0.010)
    assert settle(limit, lambda in_flight: 0.0, probes=8) >= 384  # the first measures the base
