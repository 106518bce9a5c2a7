"""The send slot: the per-instance cap measured over the calls to Evolution themselves, not only
over the relay's releases (sending.pacing.send_slot), on real Redis and, without it, per process."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from messaging.sending import breaker, pacing, worker
from tests.messaging.sending_helpers import events, open_on_simulator, send, sends_ok


def test_a_burst_goes_at_once_then_each_call_waits_one_interval_more():
    rate = 4.0
    burst = pacing.burst_for(rate)
    waits = [pacing.send_slot(7_001, rate) for _ in range(burst + 3)]
    assert waits[:burst] == [0.0] * burst
    # the slots after the burst are one interval apart (the few ms this loop takes come off each)
    for n, wait in enumerate(waits[burst:], start=1):
        assert n / rate - 0.05 <= wait <= n / rate, waits


def test_a_slot_too_far_away_is_not_reserved():
    rate = 1.0  # burst 2
    assert [pacing.send_slot(7_002, rate, max_wait=1.5) for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0, abs=0.05)]
    refused = pacing.send_slot(7_002, rate, max_wait=1.5)
    assert refused == pytest.approx(-2.0, abs=0.05)
    # nothing was reserved by the refusal: the next ask sees the same slot
    assert pacing.send_slot(7_002, rate, max_wait=1.5) == pytest.approx(-2.0, abs=0.05)


def test_the_slots_are_kept_per_instance():
    assert pacing.send_slot(7_003, 0.5) == 0.0  # burst 1: the next slot of 7003 is 2 s away
    assert pacing.send_slot(7_004, 0.5) == 0.0
    assert pacing.send_slot(7_003, 0.5, max_wait=5) == pytest.approx(2.0, abs=0.05)


def test_without_redis_each_process_keeps_the_same_slots():
    slots = pacing._LocalSlots()
    interval, tolerance = 0.25, 0.25 * (pacing.burst_for(4.0) - 1)
    now = 1_000.0
    waits = [slots.take(1, interval, tolerance, 2.0, now) for _ in range(pacing.burst_for(4.0) + 2)]
    assert waits == [0.0] * pacing.burst_for(4.0) + [0.25, 0.5]
    assert slots.take(1, interval, tolerance, 2.0, now + 10) == 0.0  # an idle instance starts afresh


def test_a_send_whose_slot_is_far_away_goes_back_to_postgres_without_an_attempt(simulator, alice, alice_instance):
    alice_instance.send_rate_per_second = 0.1  # one send per 10 s, burst 1
    alice_instance.save()
    open_on_simulator(simulator, alice_instance)
    first, second = send(alice), send(alice)
    assert worker.send_one(str(first.pk)) == "sent"

    started = time.monotonic()
    assert worker.send_one(str(second.pk)) == "held"
    assert time.monotonic() - started < 1  # it did not sleep for a slot 10 s away

    second.refresh_from_db()
    assert second.status == "QUEUED" and second.attempts == 0
    assert 8 <= (second.next_attempt_at - timezone.now()).total_seconds() <= 11
    assert events(second, "WAITING")[-1]["why"] == "instance send rate"
    assert len(sends_ok(simulator, alice_instance.name)) == 1


def test_a_send_inside_the_burst_does_not_wait(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance)
    messages = [send(alice) for _ in range(3)]
    started = time.monotonic()
    assert [worker.send_one(str(m.pk)) for m in messages] == ["sent"] * 3
    assert time.monotonic() - started < pacing.burst_for(20.0) / 20.0


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
