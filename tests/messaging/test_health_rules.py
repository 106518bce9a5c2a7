"""The health governor's rules as plain functions (messaging.health, docs/sending-policy.md "Health governor")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from messaging import health
from messaging.health import Signals, Standing, Thresholds

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
LIMITS = Thresholds()
LONG_AGO = T0 - timedelta(days=30)
HEALTHY = Standing("healthy", LONG_AGO)


def judge(standing: Standing, signals: Signals, now: datetime = T0, scale: float = 1.0) -> health.Change | None:
    return health.judge(standing, signals, now, LIMITS, scale)


def test_a_quiet_number_stays_healthy():
    assert judge(HEALTHY, Signals(sends=100)) is None


def test_an_error_on_a_cold_contact_stops_cold_contacts_for_the_cooling_period():
    change = judge(HEALTHY, Signals(cold_errors=[T0 - timedelta(minutes=1)]))
    assert change is not None
    assert (change.to, change.reason) == ("at_risk", health.COLD_ERRORS)
    assert change.cold_paused_until == T0 + timedelta(seconds=LIMITS.cooling_s)
    cooling = Standing("at_risk", T0, cold_paused_until=change.cold_paused_until)
    assert health.cooling(cooling, T0 + timedelta(hours=23))
    assert not health.cooling(cooling, T0 + timedelta(hours=24))
    # While it cools, more errors start nothing new.
    assert judge(cooling, Signals(cold_errors=[T0, T0 + timedelta(minutes=1)]), T0 + timedelta(minutes=2)) is None


def test_errors_judged_by_an_earlier_cooling_count_no_more():
    ended = Standing("healthy", T0, cold_paused_until=T0)
    assert judge(ended, Signals(cold_errors=[T0 - timedelta(minutes=5)]), T0 + timedelta(minutes=1)) is None


def test_a_high_share_of_unacknowledged_sends_puts_the_number_at_risk():
    change = judge(HEALTHY, Signals(sends=20, unacknowledged=4))
    assert change is not None and (change.to, change.reason) == ("at_risk", health.UNACKNOWLEDGED)
    assert change.evidence == {"unacknowledged": 4, "sends": 20, "share": LIMITS.unacked_share}
    assert judge(HEALTHY, Signals(sends=20, unacknowledged=3)) is None
    # Too few sends to judge a share.
    assert judge(HEALTHY, Signals(sends=5, unacknowledged=5)) is None


def test_opt_outs_above_the_threshold_put_the_number_at_risk():
    change = judge(HEALTHY, Signals(sends=40, opt_outs=2))
    assert change is not None and (change.to, change.reason) == ("at_risk", health.OPT_OUTS)
    assert judge(HEALTHY, Signals(sends=40, opt_outs=1)) is None


def test_a_disconnect_storm_rests_the_number():
    storm = [T0 - timedelta(minutes=m) for m in (1, 5, 9)]
    change = judge(HEALTHY, Signals(disconnects=storm))
    assert change is not None and (change.to, change.reason) == ("resting", health.DISCONNECTS)
    assert judge(HEALTHY, Signals(disconnects=storm[:2])) is None


def test_disconnects_before_the_last_change_of_state_were_judged_then():
    ramping = Standing("at_risk", T0 - timedelta(minutes=2))
    storm = [T0 - timedelta(minutes=m) for m in (3, 5, 9)]
    assert judge(ramping, Signals(disconnects=storm)) is None


def test_a_logout_rests_the_number():
    change = judge(HEALTHY, Signals(connected=False, logged_out_since=T0, logouts=[T0]))
    assert change is not None and (change.to, change.reason) == ("resting", health.LOGOUT)


def test_a_rest_ends_once_connected_and_quiet_then_the_number_ramps_back_at_risk():
    resting = Standing("resting", T0)
    rest = timedelta(seconds=LIMITS.rest_s)
    assert judge(resting, Signals(), T0 + rest - timedelta(seconds=1)) is None
    assert judge(resting, Signals(connected=False), T0 + rest) is None
    # A disconnect during the rest starts it again.
    later = T0 + timedelta(hours=2)
    assert judge(resting, Signals(disconnects=[later]), T0 + rest) is None
    change = judge(resting, Signals(), T0 + rest)
    assert change is not None and (change.to, change.reason) == ("at_risk", health.RAMP_BACK)


def test_at_risk_recovers_after_the_ramp_when_the_signals_are_quiet():
    ramping = Standing("at_risk", T0)
    ramp = timedelta(seconds=LIMITS.ramp_s)
    assert judge(ramping, Signals(), T0 + ramp - timedelta(seconds=1)) is None
    assert judge(ramping, Signals(sends=20, unacknowledged=10), T0 + ramp) is None
    change = judge(ramping, Signals(), T0 + ramp)
    assert change is not None and (change.to, change.reason) == ("healthy", health.RECOVERED)
    # Not while it still cools.
    cooling = Standing("at_risk", T0, cold_paused_until=T0 + ramp + timedelta(hours=1))
    assert judge(cooling, Signals(), T0 + ramp) is None


def test_a_ban_restricts_the_number_from_any_state():
    for state in ("healthy", "at_risk", "resting"):
        change = judge(Standing(state, T0), Signals(connected=False, banned=True))
        assert change is not None and (change.to, change.reason) == ("restricted", health.BANNED)


def test_a_logout_that_does_not_come_back_restricts_the_number():
    resting = Standing("resting", T0)
    out = Signals(connected=False, logged_out_since=T0, logouts=[T0])
    assert judge(resting, out, T0 + timedelta(days=2)) is None
    change = judge(resting, out, T0 + timedelta(seconds=LIMITS.logout_restrict_s))
    assert change is not None and (change.to, change.reason) == ("restricted", health.LOGOUT_NOT_BACK)


def test_repeated_logouts_restrict_the_number():
    logouts = [T0 - timedelta(days=d) for d in (0, 2, 4)]
    change = judge(HEALTHY, Signals(logouts=logouts))
    assert change is not None and (change.to, change.reason) == ("restricted", health.REPEATED_LOGOUTS)


def test_only_an_operator_lifts_a_restriction():
    assert judge(Standing("restricted", T0), Signals(), T0 + timedelta(days=365)) is None


def test_an_operators_state_holds_for_its_period():
    held = Standing("healthy", T0, override_until=T0 + timedelta(hours=1))
    storm = Signals(disconnects=[T0 + timedelta(minutes=m) for m in (1, 2, 3)], banned=True)
    assert judge(held, storm, T0 + timedelta(minutes=5)) is None
    change = judge(held, storm, T0 + timedelta(hours=1))
    assert change is not None and change.to == "restricted"


def test_the_time_scale_compresses_the_rest_and_the_ramp():
    resting = Standing("resting", T0)
    change = judge(resting, Signals(), T0 + timedelta(seconds=LIMITS.rest_s / 1000), scale=1000.0)
    assert change is not None and change.to == "at_risk"


def test_at_risk_cuts_the_caps_and_resting_or_restricted_send_nothing():
    assert health.cap_factor("at_risk", LIMITS) == LIMITS.cap_factor
    assert health.cap_factor("healthy", LIMITS) == 1.0
    assert health.sends_nothing("resting") and health.sends_nothing("restricted")
    assert not health.sends_nothing("at_risk")
