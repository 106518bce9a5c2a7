"""The sending policy's decisions as plain functions (messaging.sending.policy, docs/sending-policy.md)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from messaging.sending import policy
from messaging.sending.policy import Schedule

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
UNOFFICIAL = policy.values_for("unofficial", {})


def test_a_new_number_starts_at_the_warm_up_caps_and_reaches_the_full_ones_in_two_weeks():
    new = policy.allowance(UNOFFICIAL, None, T0, 1.0)
    assert (new.hourly, new.daily, new.cold) == (20, 50, 10)
    week = policy.allowance(UNOFFICIAL, T0, T0 + timedelta(days=7), 1.0)
    assert (week.hourly, week.daily, week.cold) == (50, 275, 55)
    warm = policy.allowance(UNOFFICIAL, T0, T0 + timedelta(days=15), 1.0)
    assert (warm.hourly, warm.daily, warm.cold) == (80, 500, 100)


def test_the_time_scale_compresses_the_warm_up():
    warm = policy.allowance(UNOFFICIAL, T0, T0 + timedelta(days=14) / 1000, 1000.0)
    assert (warm.hourly, warm.daily) == (80, 500)


def test_a_fresh_number_may_send_at_once():
    assert policy.decide(UNOFFICIAL, Schedule(), T0, 1.0, cold=True).now


def test_the_gap_holds_as_pacing_until_the_next_slot():
    verdict = policy.decide(UNOFFICIAL, Schedule(next_send_at=T0 + timedelta(seconds=9)), T0, 1.0, cold=False)
    assert (verdict.until, verdict.reason) == (T0 + timedelta(seconds=9), "pacing")


def test_gaps_are_jittered_between_the_minimum_and_the_maximum():
    rng = random.Random(7)
    gaps = [policy.gap(UNOFFICIAL, 1.0, rng).total_seconds() for _ in range(200)]
    assert min(gaps) >= 5 and max(gaps) <= 30
    assert len({round(g, 3) for g in gaps}) > 150  # never a fixed interval
    assert max(gaps) - min(gaps) > 15


def test_the_hourly_cap_of_a_new_number_is_its_warm_up():
    full_hour = Schedule(first_send_at=T0, hour_started_at=T0, hour_sent=20, day_started_at=T0, day_sent=20)
    verdict = policy.decide(UNOFFICIAL, full_hour, T0 + timedelta(minutes=30), 1.0, cold=False)
    assert (verdict.until, verdict.reason) == (T0 + timedelta(hours=1), "warming_up")


def test_a_warmed_number_at_its_hourly_cap_waits_as_hourly_cap():
    old = T0 - timedelta(days=30)
    full_hour = Schedule(first_send_at=old, hour_started_at=T0, hour_sent=80, day_started_at=T0, day_sent=80)
    verdict = policy.decide(UNOFFICIAL, full_hour, T0 + timedelta(minutes=1), 1.0, cold=False)
    assert (verdict.until, verdict.reason) == (T0 + timedelta(hours=1), "hourly_cap")
    # The next hour is a new window.
    assert policy.decide(UNOFFICIAL, full_hour, T0 + timedelta(hours=1), 1.0, cold=False).now


def test_the_daily_cap_holds_until_the_day_ends():
    old = T0 - timedelta(days=30)
    full_day = Schedule(first_send_at=old, hour_started_at=T0 + timedelta(hours=8), hour_sent=3,
                        day_started_at=T0, day_sent=500)
    verdict = policy.decide(UNOFFICIAL, full_day, T0 + timedelta(hours=8, minutes=5), 1.0, cold=False)
    assert (verdict.until, verdict.reason) == (T0 + timedelta(days=1), "daily_cap")


def test_the_cold_quota_holds_cold_contacts_only():
    schedule = Schedule(first_send_at=T0, hour_started_at=T0, hour_sent=10, day_started_at=T0, day_sent=10, day_cold=10)
    later = T0 + timedelta(minutes=40)
    assert policy.decide(UNOFFICIAL, schedule, later, 1.0, cold=False).now
    verdict = policy.decide(UNOFFICIAL, schedule, later, 1.0, cold=True)
    assert (verdict.until, verdict.reason) == (T0 + timedelta(days=1), "warming_up")


def cold_sends_late_in_the_day(count: int) -> tuple[Schedule, datetime]:
    """A warmed number whose day opened at T0 with a send to a known contact, then `count` cold contacts in its
    day's last hour; and the time of the first of them."""
    schedule = policy.after_send(UNOFFICIAL, Schedule(first_send_at=T0 - timedelta(days=30)), T0, 1.0, cold=False)
    first_cold = T0 + timedelta(hours=23)
    for n in range(count):
        schedule = policy.after_send(UNOFFICIAL, schedule, first_cold + timedelta(seconds=30 * n), 1.0, cold=True)
    return schedule, first_cold


def test_the_cold_quota_counts_the_last_24_hours_across_a_day_boundary():
    # A warmed number's quota is 100 cold contacts; it used all of them in the last hour of its day. The next day
    # opens a minute after that one ended, but WhatsApp counts a sliding 24 h: the quota comes back as those
    # sends age past 24 h, one by one, never at the day boundary.
    schedule, first_cold = cold_sends_late_in_the_day(100)
    assert schedule.day_cold == 100
    next_day = T0 + timedelta(days=1, minutes=1)
    assert policy.decide(UNOFFICIAL, schedule, next_day, 1.0, cold=False).now
    verdict = policy.decide(UNOFFICIAL, schedule, next_day, 1.0, cold=True)
    assert (verdict.until, verdict.reason) == (first_cold + timedelta(days=1), "daily_cap")
    assert not policy.cold_quota_left(UNOFFICIAL, schedule, next_day, 1.0)
    assert policy.decide(UNOFFICIAL, schedule, first_cold + timedelta(days=1, seconds=1), 1.0, cold=True).now


def test_a_cold_send_of_the_new_day_counts_the_last_days_too():
    schedule, first_cold = cold_sends_late_in_the_day(99)
    next_day = T0 + timedelta(days=1, minutes=1)
    after = policy.after_send(UNOFFICIAL, schedule, next_day, 1.0, cold=True)
    assert (after.day_started_at, after.day_cold) == (next_day, 1)
    # 99 of the last day and 1 of this one inside 24 h: the quota is used up until the oldest ages out.
    verdict = policy.decide(UNOFFICIAL, after, next_day + timedelta(minutes=1), 1.0, cold=True)
    assert verdict.until == first_cold + timedelta(days=1)
    # Only the last 24 h are kept.
    later = policy.after_send(UNOFFICIAL, after, next_day + timedelta(days=1), 1.0, cold=False)
    assert later.cold_sent_at == ()


def test_a_resting_number_holds_every_send():
    verdict = policy.decide(UNOFFICIAL, Schedule(), T0, 1.0, cold=False, health="resting")
    assert verdict.reason == "resting" and verdict.until > T0


def test_a_restricted_number_holds_every_send_as_restricted():
    verdict = policy.decide(UNOFFICIAL, Schedule(), T0, 1.0, cold=False, health="restricted")
    assert verdict.reason == "restricted" and verdict.until > T0


def test_a_number_at_risk_has_its_caps_cut():
    old = T0 - timedelta(days=30)
    half_hour = Schedule(first_send_at=old, hour_started_at=T0, hour_sent=40, day_started_at=T0, day_sent=40)
    later = T0 + timedelta(minutes=1)
    assert policy.decide(UNOFFICIAL, half_hour, later, 1.0, cold=False, health="healthy").now
    verdict = policy.decide(UNOFFICIAL, half_hour, later, 1.0, cold=False, health="at_risk", cap_factor=0.5)
    # A warmed number at its cut cap waits for its hour, not for a warm-up.
    assert (verdict.until, verdict.reason) == (T0 + timedelta(hours=1), "hourly_cap")
    cut = policy.allowance(UNOFFICIAL, None, T0, 1.0, cap_factor=0.5)
    assert (cut.hourly, cut.daily, cut.cold) == (10, 25, 5)


def test_a_cooling_period_holds_cold_contacts_only():
    until = T0 + timedelta(hours=20)
    assert policy.decide(UNOFFICIAL, Schedule(), T0, 1.0, cold=False, cold_paused_until=until).now
    verdict = policy.decide(UNOFFICIAL, Schedule(), T0, 1.0, cold=True, cold_paused_until=until)
    assert (verdict.until, verdict.reason) == (until, "cooling")
    assert not policy.cold_quota_left(UNOFFICIAL, Schedule(), T0, 1.0, cold_paused_until=until)
    # Once it ends, cold contacts go out again.
    assert policy.decide(UNOFFICIAL, Schedule(), until, 1.0, cold=True, cold_paused_until=until).now
    assert policy.cold_quota_left(UNOFFICIAL, Schedule(), until, 1.0, cold_paused_until=until)


def test_a_send_is_counted_and_draws_the_next_gap():
    after = policy.after_send(UNOFFICIAL, Schedule(), T0, 1.0, cold=True, rng=random.Random(1))
    assert after.first_send_at == T0 and (after.hour_sent, after.day_sent, after.day_cold) == (1, 1, 1)
    assert T0 + timedelta(seconds=5) <= after.next_send_at <= T0 + timedelta(seconds=30)
    again = policy.after_send(UNOFFICIAL, after, T0 + timedelta(hours=2), 1.0, cold=False)
    assert again.first_send_at == T0 and (again.hour_started_at, again.hour_sent) == (T0 + timedelta(hours=2), 1)
    assert (again.day_started_at, again.day_sent, again.day_cold) == (T0, 2, 1)


def test_overrides_are_checked_per_profile():
    assert policy.check_overrides("unofficial", {"hourly_max": 60, "gap_min_seconds": 8}) == {
        "hourly_max": 60, "gap_min_seconds": 8.0}
    assert policy.check_overrides("unofficial", {"hourly_max": None}) == {}
    assert policy.values_for("unofficial", {"hourly_max": 60})["hourly_max"] == 60


@pytest.mark.parametrize(("profile", "overrides", "field"), [
    ("unofficial", {"rate_per_second": 10}, "rate_per_second"),  # an official value
    ("official", {"hourly_max": 10}, "hourly_max"),
    ("unofficial", {"hourly_max": -1}, "hourly_max"),
    ("unofficial", {"hourly_max": 1.5}, "hourly_max"),
    ("unofficial", {"hourly_max": True}, "hourly_max"),
    ("unofficial", {"gap_max_seconds": "10"}, "gap_max_seconds"),
    ("unofficial", {"gap_min_seconds": 40, "gap_max_seconds": 30}, "gap_min_seconds"),
    ("unofficial", {"hourly_start": 90}, "hourly_start"),  # above hourly_max
    ("sideways", {}, "sendProfile"),
    ("unofficial", [], "sendPolicy"),
])
def test_a_bad_override_names_its_field(profile, overrides, field):
    with pytest.raises(policy.PolicyError) as caught:
        policy.check_overrides(profile, overrides)
    assert caught.value.field == field


def test_an_official_numbers_rate_is_its_override_else_its_own_column_else_the_default():
    assert policy.rate(40.0, 5.0, 80.0) == 40.0  # sendPolicy's rate_per_second
    assert policy.rate(None, 5.0, 80.0) == 5.0  # the instance's send_rate_per_second
    assert policy.rate(None, None, 80.0) == 80.0  # SEND_RATE_PER_INSTANCE
    assert policy.rate(None, 0.0, 0.0) == policy.MIN_RATE  # never a number that may not send again


def test_the_rate_in_force_is_the_one_the_instance_shows(settings):
    from types import SimpleNamespace

    settings.SEND_RATE_PER_INSTANCE = 12.0
    plain = SimpleNamespace(send_policy={}, send_rate_per_second=None)
    assert policy.official_rate(plain) == 12.0
    assert policy.official_rate(SimpleNamespace(send_policy={"rate_per_second": 3.0}, send_rate_per_second=7.0)) == 3.0
