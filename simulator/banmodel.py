"""A model of how WhatsApp treats a number that behaves like a machine: its settings, its clock, its rules.

It is a model, not WhatsApp's rules (WhatsApp publishes none). Its shape follows what Evolution API users
report: numbers banned after about ten parallel sends (evolution-api #439), bans for bulk sends from a
"cold" number (#1946, #2298, #2497, #2659), error 463 "reach-out time-lock" on contacts the account never
talked to (#2626, Baileys #2441, #2688). Its figures are guesses, chosen so that a human pace passes and
an unpaced campaign from a new number does not. simulator/README.md describes it for users.

Every duration is in *model* seconds: `time_scale` model seconds pass per real second, so a test can run
a week of warm-up in minutes. Nothing here touches the network; simulator/whatsapp.py applies verdicts.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Any

DAY_S = 86400.0

# The defaults: `enabled` is off, so nothing changes until a test or a chaos run turns the model on.
DEFAULTS: dict[str, Any] = {
    "enabled": False,
    # Parallel: more than this many sendText in flight at once on the number (a person types in one chat).
    "max_in_flight": 3,
    # Too fast: two sends closer than this (a person cannot type and send in under two seconds) ...
    "min_gap_s": 2.0,
    # ... or more sends than `max` inside a sliding window (a warmed-up number's allowance).
    "rate_limits": [{"window_s": 3600.0, "max": 200}, {"window_s": DAY_S, "max": 1000}],
    # Cold contacts: recipients the number never exchanged a message with, at most this many per window.
    "cold_max": 100,
    "cold_window_s": DAY_S,
    # Warm-up: a new number gets `warmup_start` of every allowance (rates, cold contacts), growing linearly to
    # the whole of it over `warmup_days`, counted from `number_age_days` at its first send.
    "number_age_days": 0.0,
    "warmup_days": 14.0,
    "warmup_start": 0.25,
    # A strike locks reach-out: for this long every send to a cold contact is another strike (463).
    "timelock_s": DAY_S,
    # Escalation: this many strikes inside the window close the session (connection.update close 401) ...
    "strikes_to_disconnect": 3,
    "strike_window_s": DAY_S,
    # ... for this long (then the number is paired again: connecting, open); null = until the control API
    # opens it.
    "disconnect_s": 3600.0,
    # ... and this many disconnects inside the window ban the number (close 403, for good).
    "disconnects_to_ban": 2,
    "ban_window_s": 7 * DAY_S,
}

_COUNTS = ("max_in_flight", "cold_max", "strikes_to_disconnect", "disconnects_to_ban")
_DURATIONS = ("min_gap_s", "cold_window_s", "timelock_s", "strike_window_s", "ban_window_s")
_MAX_LIMITS = 10
HISTORY_KEPT = 200  # standing entries kept per number


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def merge_params(base: dict[str, Any], patch: Any, *, instance: bool) -> dict[str, Any]:
    """`base` with `patch` merged in, validated; raise ValueError naming the bad field. An instance's
    `enabled` may be null (follow the global switch)."""
    if not isinstance(patch, dict):
        raise ValueError("ban_model must be an object")
    out = dict(base)
    for name, value in patch.items():
        if name == "enabled":
            if not (isinstance(value, bool) or (instance and value is None)):
                raise ValueError("ban_model.enabled must be a boolean" + (" or null" if instance else ""))
        elif name in _COUNTS:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
                raise ValueError(f"ban_model.{name} must be a whole number from 1 to 1000000")
        elif name in _DURATIONS or name in ("number_age_days", "warmup_days"):
            if not _is_number(value) or value < 0:
                raise ValueError(f"ban_model.{name} must be a number >= 0")
            value = float(value)
        elif name == "disconnect_s":
            if value is not None and (not _is_number(value) or value < 0):
                raise ValueError("ban_model.disconnect_s must be a number >= 0 or null")
            value = None if value is None else float(value)
        elif name == "warmup_start":
            if not _is_number(value) or not 0 < value <= 1:
                raise ValueError("ban_model.warmup_start must be a number in (0, 1]")
            value = float(value)
        elif name == "rate_limits":
            value = _rate_limits(value)
        else:
            raise ValueError(f"unknown ban_model field {name!r}")
        out[name] = value
    return out


def _rate_limits(value: Any) -> list[dict[str, float | int]]:
    problem = "ban_model.rate_limits must be a list of {window_s > 0, max >= 1}"
    if not isinstance(value, list) or len(value) > _MAX_LIMITS:
        raise ValueError(f"{problem}, at most {_MAX_LIMITS}")
    limits: list[dict[str, float | int]] = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"window_s", "max"}:
            raise ValueError(problem)
        window, most = item["window_s"], item["max"]
        if not _is_number(window) or window <= 0 or isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise ValueError(problem)
        limits.append({"window_s": float(window), "max": most})
    return limits


def check_time_scale(value: Any) -> float:
    if not _is_number(value) or not 0 < value <= 1_000_000:
        raise ValueError("time_scale must be a number > 0 and <= 1000000")
    return float(value)


class ModelClock:
    """Model seconds since start-up: `scale` of them per real second. A new scale applies from now on."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._real0 = time.monotonic()
        self._model0 = 0.0

    def now(self) -> float:
        return self._model0 + (time.monotonic() - self._real0) * self.scale

    def set_scale(self, scale: float) -> None:
        self._model0, self._real0, self.scale = self.now(), time.monotonic(), scale

    def real_delay(self, model_s: float) -> float:
        return model_s / self.scale


@dataclass(slots=True)
class Standing:
    """What WhatsApp (the model) holds against one number."""

    first_send: float | None = None  # model time of the first send it judged: the warm-up's day 0
    last_send: float | None = None
    sends: list[float] = field(default_factory=list)  # model times, ascending, within the longest window
    cold_sends: list[float] = field(default_factory=list)
    strikes: int = 0
    strike_times: deque[float] = field(default_factory=deque)  # since the last disconnect
    disconnects: int = 0
    disconnect_times: deque[float] = field(default_factory=deque)
    disconnected: bool = False
    disconnected_until: float | None = None  # None while disconnected: until the control API opens it
    banned: bool = False
    timelocked_until: float | None = None
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY_KEPT))

    def forget_old_strikes(self, params: dict[str, Any], now: float) -> None:
        while self.strike_times and self.strike_times[0] <= now - params["strike_window_s"]:
            self.strike_times.popleft()

    def status(self, now: float) -> str:
        if self.banned:
            return "banned"
        if self.disconnected:
            return "disconnected"
        if self.strike_times or (self.timelocked_until is not None and now < self.timelocked_until):
            return "warned"
        return "ok"

    def note(self, kind: str, now: float, **details: Any) -> None:
        self.history.append({"kind": kind, "at": round(time.time(), 3), "model_s": round(now, 3), **details})


def warmup_factor(standing: Standing, params: dict[str, Any], now: float) -> float:
    age = params["number_age_days"] + ((now - standing.first_send) / DAY_S if standing.first_send is not None else 0)
    if params["warmup_days"] <= 0 or age >= params["warmup_days"]:
        return 1.0
    start = float(params["warmup_start"])
    return start + (1 - start) * float(age) / float(params["warmup_days"])


def allowance(most: int, factor: float) -> int:
    return max(1, math.floor(most * factor))


def _count_since(times: list[float], cutoff: float) -> int:
    return len(times) - bisect_right(times, cutoff)


def _prune(times: list[float], cutoff: float) -> None:
    old = bisect_right(times, cutoff)
    if old:
        del times[:old]


def judge(standing: Standing, params: dict[str, Any], now: float, in_flight: int, cold: bool) -> list[dict[str, Any]]:
    """Record one send reaching WhatsApp; answer the rules it broke (empty: none)."""
    if standing.first_send is None:
        standing.first_send = now
    factor = warmup_factor(standing, params, now)
    broken: list[dict[str, Any]] = []
    if in_flight > params["max_in_flight"]:
        broken.append({"rule": "parallel", "in_flight": in_flight, "limit": params["max_in_flight"]})
    if standing.last_send is not None and now - standing.last_send < params["min_gap_s"]:
        broken.append({"rule": "gap", "gap_s": round(now - standing.last_send, 3), "limit": params["min_gap_s"]})
    longest = max((lim["window_s"] for lim in params["rate_limits"]), default=0.0)
    _prune(standing.sends, now - longest)
    standing.sends.append(now)
    for lim in params["rate_limits"]:
        sent, most = _count_since(standing.sends, now - lim["window_s"]), allowance(lim["max"], factor)
        if sent > most:
            broken.append({"rule": "rate", "window_s": lim["window_s"], "sends": sent, "limit": most})
    if cold:
        if standing.timelocked_until is not None and now < standing.timelocked_until:
            broken.append({"rule": "timelock", "until_model_s": round(standing.timelocked_until, 3)})
        _prune(standing.cold_sends, now - params["cold_window_s"])
        standing.cold_sends.append(now)
        reached, most = len(standing.cold_sends), allowance(params["cold_max"], factor)
        if reached > most:
            broken.append({"rule": "cold", "window_s": params["cold_window_s"], "cold": reached, "limit": most})
    standing.last_send = now
    return broken


def strike(standing: Standing, params: dict[str, Any], now: float, broken: list[dict[str, Any]],
           contact: str) -> str | None:
    """Count a strike (its send gets 463); answer "disconnect" or "ban" when it escalates, else None."""
    standing.strikes += 1
    standing.timelocked_until = now + params["timelock_s"]
    standing.note("strike", now, contact=contact, error=463, triggers=broken)
    standing.forget_old_strikes(params, now)
    standing.strike_times.append(now)
    if len(standing.strike_times) < params["strikes_to_disconnect"]:
        return None
    standing.strike_times.clear()
    standing.disconnects += 1
    gone = standing.disconnect_times
    gone.append(now)
    while gone and gone[0] <= now - params["ban_window_s"]:
        gone.popleft()
    if len(gone) >= params["disconnects_to_ban"]:
        standing.banned, standing.disconnected = True, False
        standing.note("ban", now, status_reason=403, disconnects_in_window=len(gone))
        return "ban"
    standing.disconnected = True
    pause = params["disconnect_s"]
    standing.disconnected_until = None if pause is None else now + pause
    standing.note("disconnect", now, status_reason=401, strikes=params["strikes_to_disconnect"],
                  until_model_s=None if pause is None else round(now + pause, 3))
    return "disconnect"


def report(standing: Standing, params: dict[str, Any], now: float, enabled: bool) -> dict[str, Any]:
    """The number's standing as the control API shows it."""
    standing.forget_old_strikes(params, now)
    factor = warmup_factor(standing, params, now)
    return {
        "enabled": enabled,
        "status": standing.status(now),
        "banned": standing.banned,
        "strikes": standing.strikes,
        "strikes_in_window": len(standing.strike_times),
        "disconnects": standing.disconnects,
        "timelocked": standing.timelocked_until is not None and now < standing.timelocked_until,
        "age_days": round(params["number_age_days"] + (
            (now - standing.first_send) / DAY_S if standing.first_send is not None else 0), 4),
        "allowance": {
            "rate": [{"window_s": lim["window_s"], "max": allowance(lim["max"], factor),
                      "sent": _count_since(standing.sends, now - lim["window_s"])} for lim in params["rate_limits"]],
            "cold": {"window_s": params["cold_window_s"], "max": allowance(params["cold_max"], factor),
                     "sent": _count_since(standing.cold_sends, now - params["cold_window_s"])},
        },
        "history": list(standing.history),
    }
