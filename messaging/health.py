"""The health governor's rules, as plain functions: a number's next health state from the signals it gave
(docs/sending-policy.md, "Health governor").

A number is `healthy`, `at_risk` (its caps cut), `resting` (it sends nothing) or `restricted` (it sends nothing
until an operator says otherwise). The signals are what the gateway and WhatsApp already tell the product:
- an ERROR receipt (WhatsApp's 463, the reach-out time-lock) on a message to a cold contact: the number stops
  writing to cold contacts for a cooling period, and is at risk;
- a high share of its sends that WhatsApp never acknowledged (messaging.unacknowledged): at risk;
- a storm of disconnects ("Connection Closed", a connection that leaves `open`), or a logout: resting; the rest
  ends once the number is connected and quiet for the rest period, and it ramps back at risk before it is healthy;
- opt-out replies above a share of its sends: at risk;
- a ban (connection closed 403), a logout that does not come back, or repeated logouts: restricted.
`judge` returns the one change the signals call for now, or None; messaging.governor reads the signals, applies
the change by compare-and-set and records it. Nothing here reads a clock, a database or a setting of its own.
Durations are in policy seconds (`SENDING_POLICY_TIME_SCALE` of them per real second), as the sending policy's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .choices import HealthState

# How bad each state is: a signal may always make a number's state worse, never better (that is time's job).
SEVERITY = {HealthState.HEALTHY: 0, HealthState.AT_RISK: 1, HealthState.RESTING: 2, HealthState.RESTRICTED: 3}

# The reasons a change gives (the history's `reason`, the callback's, the metric's).
COLD_ERRORS = "cold_contact_errors"
UNACKNOWLEDGED = "unacknowledged_sends"
DISCONNECTS = "disconnect_storm"
LOGOUT = "logout"
OPT_OUTS = "opt_outs"
BANNED = "banned"
LOGOUT_NOT_BACK = "logout_not_back"
REPEATED_LOGOUTS = "repeated_logouts"
RAMP_BACK = "ramp_back"
RECOVERED = "recovered"
OPERATOR = "operator"
# Each reason as an operator or a customer reads it (the dashboard).
EXPLAINED = {
    COLD_ERRORS: "WhatsApp refused a message to a new contact (463): no new contacts for a while",
    UNACKNOWLEDGED: "many of today's sends were never acknowledged by WhatsApp",
    DISCONNECTS: "the connection dropped again and again",
    LOGOUT: "the number was logged out",
    OPT_OUTS: "many recipients replied asking to stop",
    BANNED: "WhatsApp closed the connection as forbidden (banned)",
    LOGOUT_NOT_BACK: "the number was logged out and did not come back",
    REPEATED_LOGOUTS: "the number was logged out again and again",
    RAMP_BACK: "rested, connected and quiet: sending again at reduced caps",
    RECOVERED: "quiet long enough: back to full caps",
    OPERATOR: "set by an operator",
}


@dataclass(frozen=True)
class Thresholds:
    """The governor's settings (HEALTH_*), durations in policy seconds."""

    window_s: float = 3600.0
    cold_errors: int = 1
    cooling_s: float = 86400.0
    unacked_share: float = 0.2
    unacked_min_sends: int = 10
    disconnects: int = 3
    rest_s: float = 86400.0
    ramp_s: float = 3 * 86400.0
    opt_out_share: float = 0.05
    opt_out_min_sends: int = 20
    logout_restrict_s: float = 3 * 86400.0
    logouts_to_restrict: int = 3
    logout_window_s: float = 7 * 86400.0
    cap_factor: float = 0.5


@dataclass(frozen=True)
class Standing:
    """A number's health as stored: its state, since when, and until when it writes to no cold contact."""

    state: str = HealthState.HEALTHY
    since: datetime | None = None
    cold_paused_until: datetime | None = None
    # An operator's state holds until then: no signal moves it meanwhile (they are judged again after it).
    override_until: datetime | None = None


@dataclass(frozen=True)
class Signals:
    """What the number did lately, as the governor counted it (messaging.governor.signals)."""

    sends: int = 0  # sends in the number's current day: the shares' denominator
    unacknowledged: int = 0  # of those, the ones WhatsApp still has not acknowledged
    opt_outs: int = 0  # opt-out replies to the number in its current day
    cold_errors: list[datetime] = field(default_factory=list)  # ERROR receipts on cold contacts
    disconnects: list[datetime] = field(default_factory=list)  # in the window
    logouts: list[datetime] = field(default_factory=list)  # in the logout window
    connected: bool = True
    logged_out_since: datetime | None = None  # closed by a logout (401) and not open since
    banned: bool = False  # closed 403 (forbidden): WhatsApp banned the number


@dataclass(frozen=True)
class Change:
    to: str
    reason: str
    evidence: dict[str, Any]
    cold_paused_until: datetime | None


def real(seconds: float, scale: float) -> timedelta:
    return timedelta(seconds=seconds / scale)


def _after(times: list[datetime], since: datetime | None) -> list[datetime]:
    return [at for at in times if since is None or at > since]


def judge(standing: Standing, signals: Signals, now: datetime, limits: Thresholds, scale: float) -> Change | None:
    """The one change these signals call for now, or None. The worst rule that applies wins."""
    state = standing.state
    paused = standing.cold_paused_until if standing.cold_paused_until and standing.cold_paused_until > now else None
    if state == HealthState.RESTRICTED:
        return None  # only an operator lifts a restriction (messaging.governor.override)
    if standing.override_until is not None and now < standing.override_until:
        return None  # an operator's state holds for its period; the signals are judged again after it
    for change in _restrictions(signals, now, limits, scale):
        return change
    # Disconnects and logouts before the number's last change of state were judged then.
    disconnects = _after(signals.disconnects, standing.since)
    if state != HealthState.RESTING:
        if signals.logged_out_since is not None:
            return Change(HealthState.RESTING, LOGOUT, {"loggedOutAt": signals.logged_out_since.isoformat()}, paused)
        if len(disconnects) >= limits.disconnects:
            return Change(HealthState.RESTING, DISCONNECTS, {
                "disconnects": len(disconnects), "windowSeconds": limits.window_s}, paused)
    else:
        # The rest runs from the last disconnect (or the start of the rest, if later).
        last = max([at for at in (standing.since, *signals.disconnects) if at is not None], default=None)
        rested = last is None or now >= last + real(limits.rest_s, scale)
        if rested and signals.connected and signals.logged_out_since is None:
            return Change(HealthState.AT_RISK, RAMP_BACK, {"restSeconds": limits.rest_s}, paused)
        return None
    # Errors before the end of an earlier cooling period were judged then.
    cold_errors = _after(signals.cold_errors, standing.cold_paused_until)
    if paused is None and len(cold_errors) >= limits.cold_errors:
        until = now + real(limits.cooling_s, scale)
        return Change(HealthState.AT_RISK, COLD_ERRORS, {
            "errors": len(cold_errors), "coolingSeconds": limits.cooling_s}, until)
    risk = _risk(signals, limits)
    if risk is not None and state == HealthState.HEALTHY:
        return Change(HealthState.AT_RISK, risk[0], risk[1], paused)
    if state == HealthState.AT_RISK and risk is None and paused is None:
        ramped = standing.since is None or now >= standing.since + real(limits.ramp_s, scale)
        if ramped:
            return Change(HealthState.HEALTHY, RECOVERED, {"rampSeconds": limits.ramp_s}, None)
    return None


def _restrictions(signals: Signals, now: datetime, limits: Thresholds, scale: float) -> list[Change]:
    if signals.banned:
        return [Change(HealthState.RESTRICTED, BANNED, {"statusReason": 403}, None)]
    out = signals.logged_out_since
    if out is not None and now >= out + real(limits.logout_restrict_s, scale):
        return [Change(HealthState.RESTRICTED, LOGOUT_NOT_BACK, {
            "loggedOutAt": out.isoformat(), "afterSeconds": limits.logout_restrict_s}, None)]
    if len(signals.logouts) >= limits.logouts_to_restrict:
        return [Change(HealthState.RESTRICTED, REPEATED_LOGOUTS, {
            "logouts": len(signals.logouts), "windowSeconds": limits.logout_window_s}, None)]
    return []


def _risk(signals: Signals, limits: Thresholds) -> tuple[str, dict[str, Any]] | None:
    """A share of the day's sends that puts the number at risk, if one does."""
    if signals.sends >= limits.unacked_min_sends and signals.unacknowledged >= limits.unacked_share * signals.sends:
        return UNACKNOWLEDGED, {"unacknowledged": signals.unacknowledged, "sends": signals.sends,
                                "share": limits.unacked_share}
    if signals.sends >= limits.opt_out_min_sends and signals.opt_outs >= limits.opt_out_share * signals.sends:
        return OPT_OUTS, {"optOuts": signals.opt_outs, "sends": signals.sends, "share": limits.opt_out_share}
    return None


def cooling(standing: Standing, now: datetime) -> bool:
    """Whether the number writes to no cold contact now."""
    return standing.cold_paused_until is not None and now < standing.cold_paused_until


def cap_factor(state: str, limits: Thresholds) -> float:
    """The share of its caps a number in this state may use: cut at risk."""
    return limits.cap_factor if state == HealthState.AT_RISK else 1.0


def sends_nothing(state: str) -> bool:
    return state in (HealthState.RESTING, HealthState.RESTRICTED)
