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
