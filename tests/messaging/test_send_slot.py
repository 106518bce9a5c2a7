"""The send slot: the per-instance cap measured over the calls to Evolution themselves, not only
over the relay's releases (sending.pacing.send_slot), on real Redis and, without it, per process."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from messaging.sending import breaker, pacing, worker
from tests.messaging.sending_helpers import events, open_on_simulator, send, sends_ok


def timed_slots(instance_id: int, rate: float, count: int, **kwargs: float) -> list[tuple[float, float, float]]:
    """`count` asks for a slot, each as (clock before, the answer, clock after)."""
    calls = []
    for _ in range(count):
        before = time.time()
        answer = pacing.send_slot(instance_id, rate, **kwargs)
        calls.append((before, answer, time.time()))
    return calls


def slot_in(seconds: float, since: tuple[float, float, float], call: tuple[float, float, float]) -> tuple[float, float]:
    """The least and the most a slot `seconds` after the call `since` can be from `call`: the time
    between the two calls, as far as the clock read around them tells, comes off (a slow machine
    takes longer between calls; it does not move the slot)."""
    least = seconds - (call[2] - since[0])
    most = seconds - (call[0] - since[2])
    return max(0.0, least), max(0.0, most)


def test_a_burst_goes_at_once_then_each_call_waits_one_interval_more():
    rate = 4.0
    burst = pacing.burst_for(rate)
    calls = timed_slots(7_001, rate, burst + 3)
    assert [answer for _, answer, _ in calls[:burst]] == [0.0] * burst
    # the slots after the burst are one interval apart, counted from the first call
    for n, call in enumerate(calls[burst:], start=1):
        least, most = slot_in(n / rate, calls[0], call)
        assert least <= call[1] <= most, calls


def test_a_slot_too_far_away_is_not_reserved():
    rate = 1.0  # burst 2: two slots now, the third 1 s after the first call
    calls = timed_slots(7_002, rate, 3, max_wait=1.5)
    assert [answer for _, answer, _ in calls[:2]] == [0.0, 0.0]
    least, most = slot_in(1.0, calls[0], calls[2])
    assert least <= calls[2][1] <= most, calls
    # the fourth slot, 2 s after the first call, is too far: refused, and nothing is reserved, so the
    # next ask sees the same slot (each answer is minus the wait)
    for refused in timed_slots(7_002, rate, 2, max_wait=1.5):
        least, most = slot_in(2.0, calls[0], refused)
        assert least <= -refused[1] <= most and most > 1.5, (calls, refused)


def test_the_slots_are_kept_per_instance():
    [first] = timed_slots(7_003, 0.5, 1)  # burst 1: the next slot of 7003 is 2 s away
    assert first[1] == 0.0
    assert pacing.send_slot(7_004, 0.5) == 0.0
    [second] = timed_slots(7_003, 0.5, 1, max_wait=5)
    least, most = slot_in(2.0, first, second)
    assert least <= second[1] <= most and least > 0, (first, second)


def test_without_redis_each_process_keeps_the_same_slots():
    slots = pacing._LocalSlots()
    interval, tolerance = 0.25, 0.25 * (pacing.burst_for(4.0) - 1)
    now = 1_000.0
    waits = [slots.take(1, interval, tolerance, 2.0, now) for _ in range(pacing.burst_for(4.0) + 2)]
    assert waits == [0.0] * pacing.burst_for(4.0) + [0.25, 0.5]
    assert slots.take(1, interval, tolerance, 2.0, now + 10) == 0.0  # an idle instance starts afresh


def worker_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """What the lane worker sleeps for a send slot from now on (it sleeps for nothing else)."""
    slept: list[float] = []
    monkeypatch.setattr(worker, "time", SimpleNamespace(sleep=slept.append, time=time.time, monotonic=time.monotonic))
    return slept


def test_a_send_whose_slot_is_far_away_goes_back_to_postgres_without_an_attempt(
    simulator, alice, alice_instance, monkeypatch
):
    alice_instance.send_rate_per_second = 0.1  # one send per 10 s, burst 1
    alice_instance.save()
    open_on_simulator(simulator, alice_instance)
    first, second = send(alice), send(alice)
    first_sent = timezone.now()
    assert worker.send_one(str(first.pk)) == "sent"

    slept = worker_sleeps(monkeypatch)
    assert worker.send_one(str(second.pk)) == "held"
    held = timezone.now()
    assert slept == []  # it did not sleep for a slot 10 s away

    second.refresh_from_db()
    assert second.status == "QUEUED" and second.attempts == 0
    # due at its slot: 10 s after the first send took its own
    assert first_sent + timedelta(seconds=10) <= second.next_attempt_at <= held + timedelta(seconds=10)
    assert events(second, "WAITING")[-1]["why"] == "instance send rate"
    assert len(sends_ok(simulator, alice_instance.name)) == 1


def test_a_send_inside_the_burst_does_not_wait(simulator, alice, alice_instance, monkeypatch):
    open_on_simulator(simulator, alice_instance)
    messages = [send(alice) for _ in range(3)]
    slept = worker_sleeps(monkeypatch)
    assert [worker.send_one(str(m.pk)) for m in messages] == ["sent"] * 3
    assert slept == []


def test_a_probe_held_back_by_the_send_rate_is_handed_back(simulator, alice, alice_instance):
    alice_instance.send_rate_per_second = 0.1
    alice_instance.save()
    open_on_simulator(simulator, alice_instance)
    first, second = send(alice), send(alice)
    assert worker.send_one(str(first.pk)) == "sent"  # takes the only slot for 10 s
    breaker._call("set_open", breaker.GATEWAY, time.time() - 1)  # the gateway circuit is half-open

    assert worker.send_one(str(second.pk)) == "held"  # it took the probe, then its slot was too far

    # the probe did not get to run, so the next send may take it at once
    assert breaker.check(breaker.GATEWAY).probe


def test_an_otp_goes_ahead_of_the_slots_the_bulk_lanes_reserved():
    # given: the bulk lanes took the burst and reserved four slots more (the next is 1 s away at 4/s)
    rate = 4.0
    burst = pacing.burst_for(rate)
    bulk = timed_slots(7_005, rate, burst + 4)
    assert bulk[-1][1] > 0.5

    # when: an OTP asks, it may go up to one burst of intervals ahead of them: at once
    assert pacing.send_slot(7_005, rate, priority=True) == 0.0

    # then: its call still counts: the next bulk slot is the sixth interval past the burst, not the fifth
    [after] = timed_slots(7_005, rate, 1)
    least, most = slot_in(6 / rate, bulk[0], after)
    assert least <= after[1] <= most, (bulk, after)


def test_otps_alone_borrow_one_burst_and_then_keep_the_pace():
    rate = 4.0
    burst = pacing.burst_for(rate)
    otps = [pacing.send_slot(7_006, rate, priority=True) for _ in range(2 * burst + 2)]
    assert otps[: 2 * burst] == [0.0] * (2 * burst)
    assert 0 < otps[2 * burst] < otps[2 * burst + 1]  # then paced, one interval apart


def test_without_redis_an_otp_borrows_the_same():
    slots = pacing._LocalSlots()
    interval, burst = 0.25, pacing.burst_for(4.0)
    tolerance = interval * (burst - 1)
    now = 1_000.0
    for _ in range(burst + 4):
        slots.take(1, interval, tolerance, 2.0, now)
    assert slots.take(1, interval, tolerance, 2.0, now, borrow=burst * interval) == 0.0
    assert slots.take(1, interval, tolerance, 2.0, now) == 6 * interval  # the bulk's next: one interval later


def test_an_otp_is_released_from_a_bucket_the_marketing_relay_emptied():
    # the relay's bucket (pacing.take_many): marketing drew every token; an OTP may borrow one burst,
    # and marketing then takes nothing until the instance's pace has paid it back
    rate = 4.0
    burst = pacing.burst_for(rate)
    assert pacing.take(7_007, 100, rate) == burst
    assert pacing.take(7_007, 1, rate, priority=True) == 1
    assert pacing.take(7_007, burst + 5, rate, priority=True) == burst - 1  # one burst of debt at most
    assert pacing.take(7_007, 1, rate) == 0
    assert pacing.take(7_007, 1, rate, priority=True) == 0


def test_without_redis_the_relay_bucket_lends_to_an_otp_the_same():
    buckets = pacing._LocalBuckets()
    now = 1_000.0
    assert buckets.take(1, 4.0, 8, 100, now) == 8
    assert buckets.take(1, 4.0, 8, 100, now, debt=8) == 8
    assert buckets.take(1, 4.0, 8, 1, now) == 0
    assert buckets.take(1, 4.0, 8, 1, now + 1.75) == 0  # 7 of the 8 borrowed paid back: still below empty
    assert buckets.take(1, 4.0, 8, 1, now + 2.25) == 1


def test_an_otp_on_a_number_whose_slots_marketing_took_is_sent_at_once(simulator, alice, alice_instance, monkeypatch):
    # given: one send per 10 s on this number, and a marketing send took the slot (the next is 10 s away)
    alice_instance.send_rate_per_second = 0.1
    alice_instance.save()
    open_on_simulator(simulator, alice_instance)
    marketing, otp = send(alice, "MARKETING"), send(alice, "OTP", text="Your code is {{n}}")
    assert otp.instance_id == alice_instance.pk
    assert worker.send_one(str(marketing.pk)) == "sent"

    # when: the OTP's turn comes, it does not wait for the marketing's pace, nor go back to Postgres
    slept = worker_sleeps(monkeypatch)
    assert worker.send_one(str(otp.pk)) == "sent"
    assert slept == []
    assert len(sends_ok(simulator, alice_instance.name)) == 2
