import random
from datetime import datetime, timedelta, timezone

from messaging.sending import backoff


def test_delays_grow_exponentially_and_are_capped():
    rng = random.Random(1)
    nominal = [5, 15, 45, 135, 300, 300, 300]
    for attempt, expected in enumerate(nominal, start=1):
        delay = backoff.delay_for(attempt, rng)
        assert expected * 0.8 <= delay <= expected * 1.2


def test_jitter_spreads_a_herd():
    rng = random.Random(7)
    delays = {round(backoff.delay_for(1, rng), 2) for _ in range(50)}
    assert len(delays) > 40


def test_it_never_schedules_past_deliver_until():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rng = random.Random(1)
    for attempt in range(1, 8):
        for window in (2, 6, 30, 60, 200, 400):
            until = now + timedelta(seconds=window)
            due = backoff.next_attempt_at(attempt, now, until, rng)
            assert due is None or now < due < until, (attempt, window, due)
    due = backoff.next_attempt_at(1, now, now + timedelta(seconds=60), random.Random(1))
    assert due is not None and due <= now + timedelta(seconds=6)  # the backoff itself when it fits


def test_when_the_backoff_would_pass_deliver_until_one_last_attempt_comes_in_its_final_seconds():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    until = now + timedelta(seconds=60)
    rng = random.Random(1)
    last = backoff.next_attempt_at(4, now, until, rng)  # a 2¼ min backoff does not fit in 60 s
    assert last is not None and until - timedelta(seconds=5) <= last < until
    # it failed too: no time is left for another attempt, the message expires
    assert backoff.next_attempt_at(5, last, until, rng) is None
    # a deadline closer than the shortest backoff leaves no last attempt either
    assert backoff.next_attempt_at(4, until - timedelta(seconds=4), until, rng) is None


def test_last_attempts_sharing_a_deadline_are_spread():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    until = now + timedelta(seconds=60)
    rng = random.Random(5)
    lasts = {backoff.next_attempt_at(4, now, until, rng) for _ in range(50)}
    assert len(lasts) > 40 and max(lasts) - min(lasts) >= timedelta(seconds=2)


def test_an_otp_gets_the_tries_that_fit_in_two_minutes_and_a_last_one_before_the_deadline():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    until = now + timedelta(minutes=2)
    rng = random.Random(3)
    attempt, at = 1, now
    while (nxt := backoff.next_attempt_at(attempt, at, until, rng)) is not None:
        attempt, at = attempt + 1, nxt
    # 0, 5 s, 20 s, 65 s (±20 %), then the 2¼ min backoff does not fit: a last one near 2 min.
    assert attempt == 5
    assert until - timedelta(seconds=5) <= at < until
