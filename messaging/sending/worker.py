"""One send attempt for one message: claim the lease, ask the gateway, record what happened.

`send_one` is the whole unit of work behind the lane task; it is safe to run twice (the second
run finds nothing to claim) and returns what it did, so tests call it directly. The answer is recorded
by sending.answers, a lost one is resolved by sending.lost_answer, and the lease is sending.lease's.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from django.db import OperationalError, transaction
from django.utils import timezone
from psycopg.errors import LockNotAvailable
from psycopg_pool import PoolTimeout

from pilot_status import metrics
from pilot_status.database import checking_connection, release_while_waiting

from .. import consent, health, lifecycle, test_numbers
from ..choices import WaitingReason
from ..models import EventKind, FailureReason, Instance, Message
from . import (
    answers, backlog_hold, breaker, gateway, human_pace, instance_state, lease, lost_answer, own_id, pacing, policy,
    routing, simulated, slots, sticky, turns, typing_delay,
)

T = TypeVar("T")

CLAIMED = "claimed"
NOTHING_TO_CLAIM = "nothing_to_claim"
LEASE_LOST = lease.LEASE_LOST  # as the answer's application and the lost answer's resolution say it
OPTED_OUT = "opted_out"
GIVEN_BACK = "given_back"
# The WAITING line's why when a claim went back for want of a pooled connection before its call (give_back).
NO_CONNECTION = "no database connection"


class ClaimNotNow(Exception):
    """The claim changed nothing and may succeed in a moment: the task goes back to its queue (sending.tasks)."""


class NoConnectionToClaim(ClaimNotNow):
    """The process's connection pool had none free in time: the claim never reached Postgres."""


class ClaimLocked(ClaimNotNow):
    """Another transaction held the message's row past `DATABASE_LOCK_TIMEOUT_MS`: the claim was cancelled."""


class Claimed(NamedTuple):
    message: Message
    token: uuid.UUID
    opted_in: bool  # the recipient's consent held when the claim was made (messaging.consent)


def claim(message_id: str) -> Claimed | None:
    """QUEUED → SENDING with a lease; None when another worker has it or it is not due."""
    now = timezone.now()
    token = uuid.uuid4()
    # The claim doubles as the task's connection health check (one round trip less per send). Run
    # again on a replaced connection it is still safe: had the first one committed, the second finds
    # nothing to claim and the lease's expiry hands the message back (as after a crash).
    try:
        claimed = checking_connection(lambda: lifecycle.claim(
            message_id,
            token,
            now,
            # One second of slack for clock skew between the relay's host and this one.
            due_by=now + timedelta(seconds=1),
            lease_until=now + timedelta(seconds=lease.lease_seconds()),
            # Used only when the message has no id yet: its first claim, or the first after a resend.
            own_id=own_id.new(),
        ))
    except OperationalError as exc:
        if isinstance(exc.__cause__, PoolTimeout):
            raise NoConnectionToClaim(str(exc)) from exc
        if isinstance(exc.__cause__, LockNotAvailable):
            raise ClaimLocked(str(exc)) from exc
        raise
    return None if claimed is None else Claimed(claimed[0], token, claimed[1])


@dataclass
class Progress:
    """How far a claim got, for send_one's clean-up: whether its number's turn ended (turns.end freed the number)."""

    turn_ended: bool = False


def send_one(message_id: str) -> str:
    claimed = claim(message_id)
    if claimed is None:
        return NOTHING_TO_CLAIM
    message, token, opted_in = claimed
    claimed_on = message.instance
    progress = Progress()
    try:
        return send_claimed(message, token, opted_in, progress)
    finally:
        if turns.is_human(claimed_on) and not progress.turn_ended:
            # Whatever else ended the claim (an expiry, a hold, a lost answer settled, a TEST number, a claim given
            # back, a turn whose end failed, a crash), the number its relay reserved for this message is free again.
            # After a send `turns.end` already freed it (or found it held by another send): nothing is left to free.
            slots.release(claimed_on.pk, message.pk)


def send_claimed(message: Message, token: uuid.UUID, opted_in: bool, progress: Progress | None = None) -> str:
    try:
        ready = before_the_call(message, token, opted_in)
    except OperationalError as exc:
        return give_back(message, token, exc)  # nothing was sent yet: the claim may go back at once
    if isinstance(ready, str):
        return ready
    route, turn = ready
    instance = route.instance
    started = timezone.now()
    release_while_waiting()  # the call can take seconds (latency + typing): its connection serves others meanwhile
    # From here on the call may have been made: the claim is never given back (give_back), its answer is recorded.
    outcome = gateway.send_text(instance.name, message.to, message.text, typing_delay.delay_ms_for(message),
                                message_id=message.own_message_id)
    if turn is not None:
        sent = outcome.kind == gateway.SENT
        waiting_for_a_connection(message, lambda: turns.end(turn, message, sent=sent), "turn_waits_for_connection")
        if progress is not None:
            progress.turn_ended = True
    if outcome.kind == gateway.SENT and route.circuits_closed:
        # Recorded after the SENT is: the breakers' round trip is not part of an OTP's accept → SENT.
        done = record_answer(message, token, instance, outcome, started)
        breaker.record_successes([breaker.instance_scope(instance.name), breaker.GATEWAY])
        return done
    feed_breakers(instance, outcome)
    return record_answer(message, token, instance, outcome, started)


def before_the_call(
    message: Message, token: uuid.UUID, opted_in: bool
) -> str | tuple[routing.Route, turns.Turn | None]:
    """Everything a claim does before it calls Evolution: the route and the number's turn (unofficial) to send on,
    or what was done instead (held, failed, a lost answer settled, a TEST number's simulated answer: no call either)."""
    if message.unconfirmed_attempt_at is not None:
        # Before anything else, even past deliverUntil: a lost answer's send may have gone out.
        resolved = lost_answer.resolve_lost_answer(message, token)
        if resolved is not None:
            return resolved
    if not consent.may_send(message.category, opted_in):
        # The opt-out came while it waited in the outbox or a lane's queue: it never goes out.
        lifecycle.fail(message, FailureReason.OPTED_OUT, consent.DETAIL.format(why="found when it was claimed"),
                       lease_token=token)
        return OPTED_OUT
    now = timezone.now()
    if message.deliver_until <= now:
        lifecycle.fail(message, FailureReason.EXPIRED, human_pace.deadline_detail(message.hold_reason), lease_token=token)
        return "expired"
    if message.attempts >= message.max_attempts:
        # Only after a last attempt whose lost answer turned out not to have been sent.
        lifecycle.fail(
            message, FailureReason.RETRIES_EXHAUSTED,
            f"{message.attempts} attempts failed; the last one was not sent (findMessages)", lease_token=token,
        )
        return "failed"

    scenario = test_numbers.scenario_for(message.environment, message.to)
    if scenario is not None:
        return send_simulated(message, token, scenario)

    claimed_on = message.instance
    route = routing.choose(message, token)
    if isinstance(route, routing.Route):
        route = sticky.choose(message, token, route)
    if turns.is_human(claimed_on) and (isinstance(route, routing.Hold) or route.instance.pk != claimed_on.pk):
        slots.release(claimed_on.pk, message.pk)  # not sent there: the number is free for its next message now
    if isinstance(route, routing.Hold):
        metrics.messages(f"held:{route.why.replace(' ', '_')}:{message.lane}")
        lifecycle.requeue(
            message, token, route.until, EventKind.WAITING,
            detail={"why": route.why, **route.detail},
        )
        return "held"

    instance = route.instance
    turn = None
    if turns.is_human(instance):
        taken = turns.take(message, token, instance)
        if isinstance(taken, str):
            forget_probe(instance, route)
            return taken
        turn = taken
    elif not take_send_slot(message, token, route):
        return "held"
    return route, turn


def give_back(message: Message, token: uuid.UUID, exc: OperationalError) -> str:
    """A step before the call found no free pooled connection (a thread that gave its connection back, for
    connectionState or its send slot, on a busy pool): nothing was sent, so the claim goes back at once, QUEUED and
    due now with no attempt used, and an unofficial number's reservation with it, instead of both being held until
    the lease runs out. That needs a connection too: wait for one while the lease lasts, as record_answer does; past
    it (or for any other error) the error stands and the reconciler's lease expiry hands the message back. Waiting
    again is safe: the pool gave nothing, so nothing was written, and the requeue is compare-and-set on the lease."""
    if not (isinstance(exc.__cause__, PoolTimeout) and lease.lease_left(message)):
        raise exc
    instance = message.instance  # the number this claim may have reserved (routing moves message.instance with it)

    def requeue() -> bool:
        with transaction.atomic():
            given = lifecycle.requeue(message, token, timezone.now(), EventKind.WAITING,
                                      detail={"why": NO_CONNECTION, "instance": instance.name})
            if given and turns.is_human(instance):
                slots.release(instance.pk, message.pk)
        return given

    given = waiting_for_a_connection(message, requeue, "give_back_waits_for_connection")
    metrics.messages(f"held:no_database_connection:{message.lane}")
    return GIVEN_BACK if given else LEASE_LOST


def record_answer(message: Message, token: uuid.UUID, instance: Instance, outcome: gateway.Outcome,
                  started: datetime) -> str:
    """answers.apply_outcome for the answer of a call just made (waiting_for_a_connection)."""
    return waiting_for_a_connection(message, lambda: answers.apply_outcome(message, token, instance, outcome, started),
                          "answer_waits_for_connection")


def waiting_for_a_connection(message: Message, step: Callable[[], T], waits: str) -> T:
    """A step of a claim (recording the call's answer, ending the number's turn, giving the claim back), waiting for a
    pooled connection as long as the lease lasts, counted in `waits`. The answer is the one proof of what Evolution did: a thread that gave its connection back for
    the call (release_while_waiting) and finds none free within the pool's wait must not drop it, or the message stays
    SENDING (and its number reserved) until its lease runs out and Evolution is asked about it. Waiting again is safe:
    the pool gave nothing, so nothing was written, and every write here is compare-and-set (on the lease, or on the
    number's reservation)."""
    while True:
        try:
            return step()
        except OperationalError as exc:
            if not (isinstance(exc.__cause__, PoolTimeout) and lease.lease_left(message)):
                raise
            metrics.messages(f"{waits}:{message.lane}")


def send_simulated(message: Message, token: uuid.UUID, scenario: test_numbers.Scenario) -> str:
    """A TEST message to a magic number: the simulated answer (sending.simulated) recorded by
    answers.apply_outcome like a real one, then, once SENT, its receipts. No Evolution call, so neither its
    instance's state and circuits (routing) nor its send slot are asked, and no breaker is fed."""
    if scenario.holds:
        # As routing holds a message whose instance is not connected, but until deliverUntil at once: the
        # claim after it fails the message EXPIRED (the real instance's state is not touched).
        lifecycle.requeue(
            message, token, message.deliver_until, EventKind.WAITING,
            detail={"why": routing.NOT_CONNECTED, "instance": message.instance.name, "simulated": scenario.name},
        )
        return "held"
    started = timezone.now()
    outcome = simulated.answer(message, scenario)
    done = answers.apply_outcome(message, token, message.instance, outcome, started)
    if done == "sent":
        simulated.receive_receipts(message, scenario)
    return done


def take_send_slot(message: Message, token: uuid.UUID, route: routing.Route) -> bool:
    """Wait for the instance's next send slot (sending.pacing); False when it is too far away and the
    message went back to Postgres, due at that slot, with no attempt used."""
    instance = route.instance
    if not health_allows(message, token, route):
        return False
    if not take_pair_slot(message, token, route):
        return False
    wait = pacing.send_slot(instance.pk, policy.official_rate(instance), priority=message.lane == "otp")
    if wait < 0:
        forget_probe(instance, route)
        metrics.messages(f"held:paced:{message.lane}")
        lifecycle.requeue(
            message, token, min(timezone.now() + timedelta(seconds=-wait), message.deliver_until), EventKind.WAITING,
            detail={"why": "instance send rate", "instance": instance.name, "waitSeconds": round(-wait, 3)},
        )
        return False
    if wait:
        release_while_waiting()
        time.sleep(wait)
    return True


def health_allows(message: Message, token: uuid.UUID, route: routing.Route) -> bool:
    """A resting or restricted official number sends nothing either (messaging.governor): False when the message went
    back to Postgres, WAITING `resting`/`restricted`, looked at again a policy minute later, no attempt used, and the
    number's other due messages with it (backlog_hold). An instance Evolution says it does not have (connectionState
    404) is not held: Evolution logs a deleted instance out first, and its messages must meet the 404 of the send and
    fail INSTANCE_NOT_FOUND, not wait for their deadline."""
    instance = route.instance
    if not health.sends_nothing(instance.health_state) or instance_state.current(instance) == gateway.MISSING:
        return True
    forget_probe(instance, route)
    metrics.messages(f"held:{instance.health_state}:{message.lane}")
    now = timezone.now()
    until = now + policy.real(policy.RESTING_RECHECK_S, slots.scale())
    detail = {"why": instance.health_state, "instance": instance.name}
    lifecycle.requeue(message, token, min(until, message.deliver_until), EventKind.WAITING, detail=detail)
    backlog_hold.hold_due_backlog(instance.pk, until, detail, now)
    return False


def take_pair_slot(message: Message, token: uuid.UUID, route: routing.Route) -> bool:
    """An official number sends to one recipient at most once per `pair_gap_seconds` (Meta's pair rate): sleep for
    a slot close by, else back to Postgres, due then, WAITING `pacing`, no attempt used."""
    instance = route.instance
    pair_gap = policy.values_for(instance.send_profile, instance.send_policy).get("pair_gap_seconds", 0.0)
    if not pair_gap:
        return True
    wait = pacing.pair_slot(instance.pk, message.to, policy.real(pair_gap, slots.scale()).total_seconds())
    if wait < 0:
        forget_probe(instance, route)
        metrics.messages(f"held:pair_rate:{message.lane}")
        lifecycle.requeue(
            message, token, min(timezone.now() + timedelta(seconds=-wait), message.deliver_until), EventKind.WAITING,
            detail={"why": WaitingReason.PACING, "instance": instance.name, "limit": "pair rate"},
        )
        return False
    if wait:
        release_while_waiting()
        time.sleep(wait)
    return True


def forget_probe(instance: Instance, route: routing.Route) -> None:
    if not route.circuits_closed:  # a half-open circuit's probe this send took does not get to run
        breaker.record(breaker.instance_scope(instance.name), breaker.NEUTRAL)
        breaker.record(breaker.GATEWAY, breaker.NEUTRAL)


def feed_breakers(instance: Instance, outcome: gateway.Outcome) -> None:
    """The instance circuit counts every transient answer; the gateway's only Evolution being unreachable."""
    scope = breaker.instance_scope(instance.name)
    if outcome.kind in (gateway.SENT, gateway.PERMANENT):
        breaker.record(scope, breaker.OK)
        breaker.record(breaker.GATEWAY, breaker.OK)
    elif outcome.kind in (gateway.TRANSIENT, gateway.UNKNOWN):
        breaker.record(scope, breaker.FAIL)
        unreachable = outcome.status_code is None or outcome.status_code in (502, 503, 504)
        breaker.record(breaker.GATEWAY, breaker.FAIL if unreachable else breaker.OK)
    else:  # disconnected / misconfigured: says nothing about Evolution's health
        breaker.record(scope, breaker.NEUTRAL)
        breaker.record(breaker.GATEWAY, breaker.OK if outcome.kind == gateway.DISCONNECTED else breaker.NEUTRAL)
