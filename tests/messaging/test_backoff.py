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
    assert backoff.next_attempt_at(4, now, now + timedelta(seconds=60), random.Random(1)) is None
    due = backoff.next_attempt_at(1, now, now + timedelta(seconds=60), random.Random(1))
    assert due is not None and due < now + timedelta(seconds=60)


def test_an_otp_gets_the_tries_that_fit_in_two_minutes():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    until = now + timedelta(minutes=2)
    rng = random.Random(3)
    attempt, at = 1, now
    while (nxt := backoff.next_attempt_at(attempt, at, until, rng)) is not None:
        attempt, at = attempt + 1, nxt
    assert 3 <= attempt <= 4
