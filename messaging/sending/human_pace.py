"""The relay's side of an unofficial number's sending policy (docs/sending-policy.md): release only what each number
may send now, one message per number, and keep the rest in the outbox until their number may send, saying why.

For the numbers among a pass's candidates the relay reads their schedules, asks the policy (messaging.sending.policy)
whether each may send now, and reserves each one that may for its first candidate (messaging.sending.slots: compare-
and-set, so two relays never release two sends for one number). Every other candidate is held: its outbox entry is
due when its number may send (its next slot, the end of a full window), never past its deliverUntil, and its message
gets a WAITING line when its reason changes (`lifecycle.hold`). The relay knows each candidate's recipient (its
number's exchanges with them: one query per pass, messaging.exchanges.known_pairs): a cold contact counts against its
number's cold-contact quota, so a message that quota holds says so, and does not keep the number from a message
behind it to a known recipient. The worker decides again at the claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings

from .. import exchanges, governor, lifecycle, rules
from ..choices import ConnectionState, WaitingReason
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
    project_id: int
    to: str
    pinned: bool  # its client named the instance: the sticky sender never moves it
    category: str


@dataclass(frozen=True)
class Hold:
    until: datetime
    reason: str
    instance: str
    expire: bool = False  # its number may not send before its deliverUntil: it fails now, naming the limit
    failure: str = FailureReason.EXPIRED
    detail: str = ""


def release(candidates: list[Any], room: int, lane: str, now: datetime) -> tuple[list[Any], dict[Any, Hold]]:
    """Of these candidates (all on unofficial numbers, in release order), the ones released now (at most `room`,
    each number reserved for it), and the ones held with why and until when.

    Each candidate is judged as the worker will judge it: a recipient its number never exchanged a message with is a
    cold contact, and the cold-contact quota (or a cooling period) holds it, naming that limit, while a message behind
    it to a known recipient may go. A cold contact another number of the project might take is released all the same:
    the worker's sticky sender moves it (messaging.sending.sticky)."""
    by_number: dict[int, list[Any]] = {}
    for candidate in candidates:
        by_number.setdefault(candidate.instance_id, []).append(candidate)
    numbers = {row["id"]: row for row in Instance.objects.filter(pk__in=list(by_number)).values(
        "id", "name", "send_policy", "health_state", "cold_paused_until")}
    standings = slots.standings(list(by_number), now)
    known = exchanges.known_pairs((c.instance_id, c.to) for c in candidates)
    cold = {c.message_id for c in candidates if (c.instance_id, c.to) not in known}
    others = _OtherNumbers()
    scale = slots.scale()
    wanted: dict[int, Any] = {}
    holds: dict[Any, Hold] = {}
    for number, rows in by_number.items():
        values = policy.values_for(SendProfile.UNOFFICIAL, numbers[number]["send_policy"])
        standing = standings[number]
        name = numbers[number]["name"]
        health = governor.policy_terms(numbers[number]["health_state"], numbers[number]["cold_paused_until"])
        # The policy's verdict for a known recipient, and for a cold contact when one is among the number's candidates.
        plain = {is_cold: policy.decide(values, standing.schedule, now, scale, cold=is_cold, **health)
                 for is_cold in {False} | {c.message_id in cold for c in rows}}
        gap = policy.Verdict(now + policy.real(values["gap_min_seconds"], scale), WaitingReason.PACING)
        # One send at a time: the next cannot start before this one ends and its gap has passed.
        verdicts = {is_cold: gap if verdict.now and standing.in_flight else verdict
                    for is_cold, verdict in plain.items()}

        def own(row: Any) -> policy.Verdict:
            return verdicts[row.message_id in cold]

        def cold_only(row: Any) -> bool:
            """Held by a limit on cold contacts alone (the quota, a cooling period): the number may send otherwise."""
            return row.message_id in cold and plain[False].now and not plain[True].now

        def may_go(row: Any) -> bool:
            if own(row).now:
                return True
            return cold_only(row) and not standing.in_flight and others.may_take(number, row)

        chosen = next((row for row in rows if may_go(row)), None)
        for row in rows:
            if row is chosen:
                if len(wanted) < room:
                    wanted[number] = row
                # else no room in the lane this pass: still due, held back like any other
            elif not may_go(row):
                holds[row] = _hold(row, own(row), name, row.to if cold_only(row) else None)
            elif number in wanted:
                holds[row] = _hold(row, gap, name)  # behind the one released: the next slot at the earliest
    reserved = slots.reserve({number: row.message_id for number, row in wanted.items()}, now,
                             now + timedelta(seconds=settings.SEND_LEASE_SECONDS), otp=lane == "otp")
    for number, row in wanted.items():
        if number not in reserved:
            holds[row] = _hold(row, policy.Verdict(now + RETRY_SOON, WaitingReason.PACING), numbers[number]["name"])
    return [row for number, row in wanted.items() if number in reserved], holds


class _OtherNumbers:
    """Whether another open number might take a message from its own (the sticky sender's fallbacks, by the rule
    rules.fallback_instances applies: rules.may_route_to). Read once per pass, and only when a cold contact is held by
    its number's cold-contact limit."""

    def __init__(self) -> None:
        self.open: list[tuple[int, int | None]] | None = None

    def may_take(self, number: int, candidate: Any) -> bool:
        if candidate.pinned:
            return False
        if self.open is None:
            self.open = list(Instance.objects.filter(connection_state=ConnectionState.OPEN).values_list(
                "id", "project_id"))
        return any(other != number and rules.may_route_to(candidate.category, candidate.project_id, owner)
                   for other, owner in self.open)


def _hold(candidate: Any, verdict: policy.Verdict, instance: str, cold_to: str | None = None) -> Hold:
    """A held candidate; one its number may not send before its deliverUntil fails now: EXPIRED naming the limit, or
    NO_WARM_INSTANCE when only the cold-contact limit holds it (`cold_to`, its recipient) and no other number may
    take it, as the worker's claim would say (messaging.sending.turns)."""
    assert verdict.until is not None
    late = candidate.deliver_until is not None and verdict.until >= candidate.deliver_until
    if not late:
        return Hold(verdict.until, verdict.reason, instance)
    if cold_to is not None:
        return Hold(verdict.until, verdict.reason, instance, expire=True, failure=FailureReason.NO_WARM_INSTANCE,
                    detail=no_warm_detail(cold_to, verdict.reason, instance, verdict.until))
    return Hold(verdict.until, verdict.reason, instance, expire=True,
                detail=expired_detail(verdict.reason, verdict.until))


def no_warm_detail(to: str, why: str, instance: str, until: datetime) -> str:
    """A NO_WARM_INSTANCE message's detail: the limit that held it on its number, and until when."""
    return (f"no number of the project knows {to} or has cold contacts left before deliverUntil "
            f"({why} on {instance} until {until.isoformat()})")


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
            lifecycle.expire(message, held.failure, held.detail)
            continue
        detail = {"why": held.reason, "instance": held.instance}
        lines[candidate.message_id] = (held.until, str(hold_reason(EventKind.WAITING, detail, None)), detail)
    if lines:
        lifecycle.hold([c.pk for c, held in holds.items() if not held.expire], lines, now)
