"""The relay's side of an unofficial number's sending policy (docs/sending-policy.md): release only what each number
may send now, one message per number, and keep the rest in the outbox until their number may send, saying why.

For the numbers among a pass's candidates the relay reads their schedules, asks the policy (messaging.sending.policy)
whether each may send now, and reserves each one that may for its first candidate (messaging.sending.slots: compare-
and-set, so two relays never release two sends for one number). Every other candidate is held: its outbox entry is
due when its number may send (its next slot, the end of a full window), never past its deliverUntil, and its message
gets a WAITING line when its reason changes (`lifecycle.hold`). The worker decides again at the claim, knowing the
recipient (a cold contact counts against the number's daily quota).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings

from .. import governor, lifecycle
from ..choices import WaitingReason
from ..holds import hold_reason
from ..models import EventKind, FailureReason, Instance, Message, SendProfile
from . import policy, slots

# A candidate the OTP relay may take first, or that another relay reserved meanwhile: looked at again this soon.
RETRY_SOON = timedelta(seconds=1)


class Candidate(Protocol):
    pk: int
    message_id: str
    instance_id: int
    deliver_until: datetime | None


@dataclass(frozen=True)
class Hold:
    until: datetime
    reason: str
    instance: str
    expire: bool = False  # its number may not send before its deliverUntil: EXPIRED now, naming the limit


def release(candidates: list[Any], room: int, lane: str, now: datetime) -> tuple[list[Any], dict[Any, Hold]]:
    """Of these candidates (all on unofficial numbers, in release order), the ones released now (at most `room`,
    each number reserved for it), and the ones held with why and until when."""
    by_number: dict[int, list[Any]] = {}
    for candidate in candidates:
        by_number.setdefault(candidate.instance_id, []).append(candidate)
    numbers = {row["id"]: row for row in Instance.objects.filter(pk__in=list(by_number)).values(
        "id", "name", "send_policy", "health_state", "cold_paused_until")}
    standings = slots.standings(list(by_number), now)
    scale = slots.scale()
    wanted: dict[int, Any] = {}
    holds: dict[Any, Hold] = {}
    for number, rows in by_number.items():
        values = policy.values_for(SendProfile.UNOFFICIAL, numbers[number]["send_policy"])
        standing = standings[number]
        name = numbers[number]["name"]
        health = governor.policy_terms(numbers[number]["health_state"], numbers[number]["cold_paused_until"])
        verdict = policy.decide(values, standing.schedule, now, scale, cold=False, **health)
        if verdict.now and standing.in_flight:
            # One send at a time: the next cannot start before this one ends and its gap has passed.
            verdict = policy.Verdict(now + policy.real(values["gap_min_seconds"], scale), WaitingReason.PACING)
        if verdict.now and len(wanted) < room:
            wanted[number] = rows[0]
            behind = policy.Verdict(now + policy.real(values["gap_min_seconds"], scale), WaitingReason.PACING)
            holds.update({row: _hold(row, behind, name) for row in rows[1:]})
        elif verdict.now:
            continue  # no room in the lane this pass: still due, held back like any other
        else:
            holds.update({row: _hold(row, verdict, name) for row in rows})
    reserved = slots.reserve({number: row.message_id for number, row in wanted.items()}, now,
                             now + timedelta(seconds=settings.SEND_LEASE_SECONDS), otp=lane == "otp")
    for number, row in wanted.items():
        if number not in reserved:
            holds[row] = _hold(row, policy.Verdict(now + RETRY_SOON, WaitingReason.PACING), numbers[number]["name"])
    return [row for number, row in wanted.items() if number in reserved], holds


def _hold(candidate: Any, verdict: policy.Verdict, instance: str) -> Hold:
    assert verdict.until is not None
    late = candidate.deliver_until is not None and verdict.until >= candidate.deliver_until
    return Hold(verdict.until, verdict.reason, instance, expire=late)


def deadline_detail(hold_reason: str | None) -> str:
    """An EXPIRED message's detail: which limit of the sending policy held it, if one did."""
    why = (hold_reason or "").split("|")[0]
    if why in WaitingReason.values:
        return expired_detail(why)
    return "deliverUntil passed before a send succeeded"


def expired_detail(why: str, until: datetime | None = None) -> str:
    """An EXPIRED message's detail when the sending policy held it: which limit."""
    when = f" (its number may send again at {until.isoformat()})" if until else ""
    return f"deliverUntil passed while the number's sending policy held the message: {why}{when}"


def hold(holds: dict[Any, Hold], now: datetime) -> None:
    """Write the holds: the entries due later, each message's WAITING line when its reason changed."""
    if not holds:
        return
    lines: dict[str, tuple[datetime, str, dict[str, Any]]] = {}
    for candidate, held in holds.items():
        if held.expire:
            message = Message.objects.get(pk=candidate.message_id)
            lifecycle.expire(message, FailureReason.EXPIRED, expired_detail(held.reason, held.until))
            continue
        detail = {"why": held.reason, "instance": held.instance}
        lines[candidate.message_id] = (held.until, str(hold_reason(EventKind.WAITING, detail, None)), detail)
    if lines:
        lifecycle.hold([c.pk for c, held in holds.items() if not held.expire], lines, now)
