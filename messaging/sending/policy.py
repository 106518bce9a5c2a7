"""The sending policy of a number, as plain functions: its values, and whether it may send now (docs/sending-policy.md).

A number is an identity that WhatsApp bans when it behaves like a machine. Each instance has a send profile:
- `unofficial` (a Baileys-connected number, the default for a new instance): one send in flight, a jittered gap
  between sends, hourly and daily caps that ramp up from the number's first send (warm-up), a daily quota of cold
  contacts (recipients it never exchanged a message with);
- `official` (a Cloud API number behind Evolution): Meta's throughput tier and pair rate.
Every value below is a default that an instance may override (`Instance.send_policy`, admin and
`PATCH /v1/instances/{name}`). The schedule these functions read and write lives in Postgres
(`SendSchedule`, messaging.sending.slots); nothing here reads a clock, a database or a random source of its own.

Durations are in *policy* seconds: `SENDING_POLICY_TIME_SCALE` of them pass per real second, so that a test or a
chaos run compresses a week of warm-up into minutes (the simulator's `time_scale` has the same meaning).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from ..choices import HealthState, SendProfile, WaitingReason

HOUR_S = 3600.0
DAY_S = 86400.0
RESTING_RECHECK_S = 60.0

# Each profile's values, with where they come from (docs/sending-policy.md says the same at length).
DEFAULTS: dict[str, dict[str, float]] = {
    SendProfile.UNOFFICIAL: {
        # A random gap between two sends: anti-ban guides use 5-15 s (open-wa) to 5-30 s (Effess), jittered.
        "gap_min_seconds": 5.0,
        "gap_max_seconds": 30.0,
        # Warm-up caps of a new number (Effess: 20/h and 50/day on days 1-2) ...
        "hourly_start": 20,
        "daily_start": 50,
        # ... growing linearly to a warmed number's (Effess: 80/h by default, 500/day after day 6) ...
        "hourly_max": 80,
        "daily_max": 500,
        # ... over two weeks from the first send (Effess: 7-14 days).
        "warmup_days": 14.0,
        # Recipients the number never exchanged a message with, per day: the commonest cause of bans (463, the
        # reach-out time-lock; "always send to known contacts first"). New accounts get flagged above 20-30
        # messages a day in their first week (MoltFlow): a third of that to strangers, growing with the caps.
        "cold_daily_start": 10,
        "cold_daily_max": 100,
    },
    SendProfile.OFFICIAL: {
        # Meta's Cloud API: 80 messages/s per business number by default ("Throughput") ...
        "rate_per_second": 80.0,
        # ... and one message every 6 s to one WhatsApp user ("pair rate", error 131056).
        "pair_gap_seconds": 6.0,
    },
}
# The bounds an override must keep: (least, most). A gap of 0 or a cap of 0 is allowed (an operator's choice).
BOUNDS: dict[str, tuple[float, float]] = {
    "gap_min_seconds": (0.0, 3600.0), "gap_max_seconds": (0.0, 3600.0),
    "hourly_start": (0, 100_000), "hourly_max": (0, 100_000), "daily_start": (0, 1_000_000),
    "daily_max": (0, 1_000_000), "warmup_days": (0.0, 365.0), "cold_daily_start": (0, 1_000_000),
    "cold_daily_max": (0, 1_000_000), "rate_per_second": (0.01, 10_000.0), "pair_gap_seconds": (0.0, 3600.0),
}
COUNTS = {"hourly_start", "hourly_max", "daily_start", "daily_max", "cold_daily_start", "cold_daily_max"}


class PolicyError(ValueError):
    """An override that cannot be stored: `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def values_for(profile: str, overrides: dict[str, Any] | None) -> dict[str, float]:
    """The profile's values with the instance's overrides (already checked) applied."""
    values = dict(DEFAULTS[SendProfile(profile)])
    values.update({k: v for k, v in (overrides or {}).items() if k in values})
    return values


# The slowest pace a number is given: a rate of 0 would never send again.
MIN_RATE = 0.01


def rate(own: float | None, column: float | None, default: float) -> float:
    """An official number's sends per second: its policy's `rate_per_second` override (`own`), else its
    `send_rate_per_second` (`column`), else `default` (SEND_RATE_PER_INSTANCE). The one place a number's rate is
    decided: the relay's bucket (messaging.dispatch) and the worker's send slot (sending.pacing) both pace at it."""
    chosen = own or column or default
    return max(float(chosen), MIN_RATE)


def official_rate(instance: Any) -> float:
    """`rate` for an Instance."""
    return rate((instance.send_policy or {}).get("rate_per_second"), instance.send_rate_per_second,
                settings.SEND_RATE_PER_INSTANCE)


def check_overrides(profile: str, overrides: Any) -> dict[str, float]:
    """Overrides as they may be stored for this profile; PolicyError naming the first bad field. A null value drops
    the override (the default applies again)."""
    if profile not in SendProfile.values:
        raise PolicyError("sendProfile", f"sendProfile must be one of {', '.join(SendProfile.values)}.")
    if not isinstance(overrides, dict):
        raise PolicyError("sendPolicy", "sendPolicy must be an object of values to override.")
    known = DEFAULTS[SendProfile(profile)]
    clean: dict[str, float] = {}
    for name, value in overrides.items():
        if name not in known:
            raise PolicyError(name, f"{name!r} is not a value of the {profile} profile: one of {', '.join(known)}.")
        if value is None:
            continue
        least, most = BOUNDS[name]
        whole = name in COUNTS
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (whole and value != int(value)) or not least <= value <= most:
            kind = "a whole number" if whole else "a number"
            raise PolicyError(name, f"{name} must be {kind} from {least:g} to {most:g}.")
        clean[name] = int(value) if whole else float(value)
    merged = {**known, **clean}
    for low, high in (("gap_min_seconds", "gap_max_seconds"), ("hourly_start", "hourly_max"),
                      ("daily_start", "daily_max"), ("cold_daily_start", "cold_daily_max")):
        if low in merged and merged[low] > merged[high]:
            raise PolicyError(low, f"{low} may not be above {high} ({merged[high]:g}).")
    return clean


@dataclass(frozen=True)
class Schedule:
    """What a number has sent lately (a SendSchedule row): the windows are fixed, each opened by its first send; the
    cold contacts are also kept by time (`cold_sent_at`, the last 24 policy-hours, oldest first)."""

    next_send_at: datetime | None = None
    first_send_at: datetime | None = None
    hour_started_at: datetime | None = None
    hour_sent: int = 0
    day_started_at: datetime | None = None
    day_sent: int = 0
    day_cold: int = 0
    cold_sent_at: tuple[datetime, ...] = ()


@dataclass(frozen=True)
class Allowance:
    hourly: int
    daily: int
    cold: int


@dataclass(frozen=True)
class Verdict:
    """May the number send now? If not: until when, and why (a WaitingReason)."""

    until: datetime | None = None
    reason: str = ""

    @property
    def now(self) -> bool:
        return self.until is None


def real(seconds: float, scale: float) -> timedelta:
    """Policy seconds as real time."""
    return timedelta(seconds=seconds / scale)


def allowance(values: dict[str, float], first_send_at: datetime | None, now: datetime, scale: float,
              cap_factor: float = 1.0) -> Allowance:
    """The caps of the warm-up ramp: from the start values at the first send to the full ones after warmup_days,
    times the share a number at risk may use (messaging.health.cap_factor)."""
    days = values["warmup_days"]
    age = 0.0 if first_send_at is None else max(0.0, (now - first_send_at).total_seconds() * scale / DAY_S)
    share = 1.0 if days <= 0 else min(1.0, age / days)

    def ramp(name: str) -> int:
        start, full = values[f"{name}_start"], values[f"{name}_max"]
        return int((start + (full - start) * share) * cap_factor)

    return Allowance(ramp("hourly"), ramp("daily"), ramp("cold_daily"))


def _window(started: datetime | None, count: int, length: timedelta, now: datetime) -> tuple[datetime | None, int]:
    """A fixed window and its count as they stand at `now`: an ended window counts nothing."""
    if started is None or now >= started + length:
        return None, 0
    return started, count


def _recent_cold(schedule: Schedule, day: timedelta, now: datetime) -> tuple[datetime, ...]:
    """The number's sends to cold contacts in the 24 policy-hours before `now`, oldest first."""
    return tuple(at for at in schedule.cold_sent_at if at > now - day)


def _cold_frees_at(schedule: Schedule, cap: int, day: timedelta, now: datetime) -> datetime | None:
    """When the number may write to one more cold contact: None now, else when enough of its cold sends are
    older than a day. Both counts hold: the day window's, and the sliding 24 h's (WhatsApp counts cold contacts
    over a sliding 24 h, so a quota used at the end of one day and again at the start of the next would be twice
    the quota inside 24 h)."""
    recent = _recent_cold(schedule, day, now)
    day_start, day_cold = _window(schedule.day_started_at, schedule.day_cold, day, now)
    if day_cold < cap and len(recent) < cap:
        return None
    ends = [day_start + day] if day_cold >= cap and day_start is not None else []
    if len(recent) >= cap:
        ends.append(recent[len(recent) - cap] + day if cap > 0 else now + day)
    return max(ends, default=now + day)


def _held(cap: int, warmed: float, name: str) -> str:
    """The reason a full window gives: the warm-up while its cap is still below the warmed number's (both cut alike
    while the number is at risk)."""
    return WaitingReason.WARMING_UP if cap < int(warmed) else name


def decide(values: dict[str, float], schedule: Schedule, now: datetime, scale: float, *, cold: bool,
           health: str = HealthState.HEALTHY, cap_factor: float = 1.0,
           cold_paused_until: datetime | None = None) -> Verdict:
    """Whether an unofficial number may send one more message now (to a cold contact or not). Its health
    (messaging.governor) takes part: `resting` and `restricted` hold every send, `at_risk` cuts the caps by
    `cap_factor`, and a cooling period (`cold_paused_until`) holds the sends to cold contacts."""
    if health in (HealthState.RESTING, HealthState.RESTRICTED):
        # How long a rest or a restriction lasts is not known here: look again in a minute.
        reason = WaitingReason.RESTING if health == HealthState.RESTING else WaitingReason.RESTRICTED
        return Verdict(now + real(RESTING_RECHECK_S, scale), reason)
    if schedule.next_send_at is not None and schedule.next_send_at > now:
        return Verdict(schedule.next_send_at, WaitingReason.PACING)
    caps = allowance(values, schedule.first_send_at, now, scale, cap_factor)
    hour, day = real(HOUR_S, scale), real(DAY_S, scale)
    hour_start, hour_sent = _window(schedule.hour_started_at, schedule.hour_sent, hour, now)
    day_start, day_sent = _window(schedule.day_started_at, schedule.day_sent, day, now)
    # A window that has not opened ends a day (an hour) after the send that would open it.
    day_ends, hour_ends = (day_start or now) + day, (hour_start or now) + hour
    if day_sent >= caps.daily:
        return Verdict(day_ends, _held(caps.daily, values["daily_max"] * cap_factor, WaitingReason.DAILY_CAP))
    if cold and cold_paused_until is not None and now < cold_paused_until:
        return Verdict(cold_paused_until, WaitingReason.COOLING)
    if cold and (cold_until := _cold_frees_at(schedule, caps.cold, day, now)) is not None:
        return Verdict(cold_until, _held(caps.cold, values["cold_daily_max"] * cap_factor, WaitingReason.DAILY_CAP))
    if hour_sent >= caps.hourly:
        return Verdict(hour_ends, _held(caps.hourly, values["hourly_max"] * cap_factor, WaitingReason.HOURLY_CAP))
    return Verdict()


def cold_quota_left(values: dict[str, float], schedule: Schedule, now: datetime, scale: float,
                    cap_factor: float = 1.0, cold_paused_until: datetime | None = None) -> bool:
    """Whether the number may still write to a recipient it never exchanged a message with now (its day, and the
    last 24 h; none during a cooling period)."""
    if cold_paused_until is not None and now < cold_paused_until:
        return False
    caps = allowance(values, schedule.first_send_at, now, scale, cap_factor)
    return _cold_frees_at(schedule, caps.cold, real(DAY_S, scale), now) is None


def gap(values: dict[str, float], scale: float, rng: random.Random | None = None) -> timedelta:
    """The jittered gap before the number's next send: uniform between the minimum and the maximum."""
    draw = (rng or random).uniform(values["gap_min_seconds"], values["gap_max_seconds"])
    return real(draw, scale)


def after_send(values: dict[str, float], schedule: Schedule, now: datetime, scale: float, *, cold: bool,
               rng: random.Random | None = None) -> Schedule:
    """The schedule once a send went to the gateway: counted in its windows, the next send a jittered gap away."""
    hour_start, hour_sent = _window(schedule.hour_started_at, schedule.hour_sent, real(HOUR_S, scale), now)
    day_start, day_sent = _window(schedule.day_started_at, schedule.day_sent, real(DAY_S, scale), now)
    _, day_cold = _window(schedule.day_started_at, schedule.day_cold, real(DAY_S, scale), now)
    recent = _recent_cold(schedule, real(DAY_S, scale), now)
    return replace(
        schedule,
        next_send_at=now + gap(values, scale, rng),
        first_send_at=schedule.first_send_at or now,
        hour_started_at=hour_start or now, hour_sent=hour_sent + 1,
        day_started_at=day_start or now, day_sent=day_sent + 1, day_cold=day_cold + int(cold),
        cold_sent_at=recent + (now,) if cold else recent,
    )
