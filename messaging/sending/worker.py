"""One send attempt for one message: claim the lease, ask the gateway, record what happened.

`send_one` is the whole unit of work behind the lane task; it is safe to run twice (the second
run finds nothing to claim) and returns what it did, so tests call it directly.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timedelta
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.utils import timezone
from psycopg.errors import LockNotAvailable
from psycopg_pool import PoolTimeout

from pilot_status import metrics
from pilot_status.database import checking_connection, release_while_waiting

from .. import consent, governor, health, lifecycle, test_numbers
from ..choices import WaitingReason
from ..models import EventKind, FailureReason, Instance, Message, Status
from ..writes import TimelineLine
from . import (
    backoff, breaker, budget, evidence, gateway, human_pace, instance_state, own_id, pacing, policy, routing, simulated,
    slots, sticky, turns, typing_delay,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# A 401 from Evolution is our configuration, not the message's fault: wait, shout, burn nothing.
MISCONFIGURED_WAIT = timedelta(seconds=30)

CLAIMED = "claimed"
NOTHING_TO_CLAIM = "nothing_to_claim"
LEASE_LOST = "lease_lost"
OPTED_OUT = "opted_out"
GIVEN_BACK = "given_back"
# The WAITING line's why when a claim went back for want of a pooled connection before its call (give_back).
NO_CONNECTION = "no database connection"


def lease_seconds() -> float:
    """The lease a claim takes: SEND_LEASE_SECONDS, and never less than the claim's worst case
    (settings refuses a shorter one at start-up; this also holds for settings changed at run time)."""
    needed = budget.lease_seconds_needed(
        settings.EVOLUTION_CONNECT_TIMEOUT, settings.EVOLUTION_READ_TIMEOUT, settings.TYPING_DELAY_MAX_MS
    )
    return float(max(settings.SEND_LEASE_SECONDS, needed))


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
            lease_until=now + timedelta(seconds=lease_seconds()),
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


def send_one(message_id: str) -> str:
    claimed = claim(message_id)
    if claimed is None:
        return NOTHING_TO_CLAIM
    message, token, opted_in = claimed
    claimed_on = message.instance
    try:
        return send_claimed(message, token, opted_in)
    finally:
        if turns.is_human(claimed_on):
            # Whatever ended the claim (an expiry, a lost answer settled, a TEST number, a crash), the number its
            # relay reserved for this message is free again; after a send, `turns.end` already freed it.
            slots.release(claimed_on.pk, message.pk)


def send_claimed(message: Message, token: uuid.UUID, opted_in: bool) -> str:
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
        after_the_call(message, lambda: turns.end(turn, message, sent=sent), "turn_waits_for_connection")
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
        resolved = resolve_lost_answer(message, token)
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
    instance = message.instance  # the number this claim may have reserved (routing moves message.instance with it)
    while isinstance(exc.__cause__, PoolTimeout) and lease_left(message):
        try:
            with transaction.atomic():
                given = lifecycle.requeue(message, token, timezone.now(), EventKind.WAITING,
                                          detail={"why": NO_CONNECTION, "instance": instance.name})
                if given and turns.is_human(instance):
                    slots.release(instance.pk, message.pk)
        except OperationalError as again:
            exc = again
            metrics.messages(f"give_back_waits_for_connection:{message.lane}")
            continue
        metrics.messages(f"held:no_database_connection:{message.lane}")
        return GIVEN_BACK if given else LEASE_LOST
    raise exc


def record_answer(message: Message, token: uuid.UUID, instance: Instance, outcome: gateway.Outcome,
                  started: datetime) -> str:
    """apply_outcome for the answer of a call just made (after_the_call)."""
    return after_the_call(message, lambda: apply_outcome(message, token, instance, outcome, started),
                          "answer_waits_for_connection")


def after_the_call(message: Message, step: Callable[[], T], waits: str) -> T:
    """A step after the call (recording its answer, ending the number's turn), waiting for a pooled connection as long
    as the lease lasts. The answer is the one proof of what Evolution did: a thread that gave its connection back for
    the call (release_while_waiting) and finds none free within the pool's wait must not drop it, or the message stays
    SENDING (and its number reserved) until its lease runs out and Evolution is asked about it. Waiting again is safe:
    the pool gave nothing, so nothing was written, and every write here is compare-and-set (on the lease, or on the
    number's reservation)."""
    while True:
        try:
            return step()
        except OperationalError as exc:
            if not (isinstance(exc.__cause__, PoolTimeout) and lease_left(message)):
                raise
            metrics.messages(f"{waits}:{message.lane}")


def lease_left(message: Message) -> bool:
    return message.lease_expires_at is not None and timezone.now() < message.lease_expires_at


def send_simulated(message: Message, token: uuid.UUID, scenario: test_numbers.Scenario) -> str:
    """A TEST message to a magic number: the simulated answer (sending.simulated) recorded by
    apply_outcome like a real one, then, once SENT, its receipts. No Evolution call, so neither its
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
    done = apply_outcome(message, token, message.instance, outcome, started)
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
    back to Postgres, WAITING `resting`/`restricted`, looked at again a policy minute later, no attempt used. An
    instance Evolution says it does not have (connectionState 404) is not held: Evolution logs a deleted instance out
    first, and its messages must meet the 404 of the send and fail INSTANCE_NOT_FOUND, not wait for their deadline."""
    instance = route.instance
    if not health.sends_nothing(instance.health_state) or instance_state.current(instance) == gateway.MISSING:
        return True
    forget_probe(instance, route)
    metrics.messages(f"held:{instance.health_state}:{message.lane}")
    until = timezone.now() + policy.real(policy.RESTING_RECHECK_S, slots.scale())
    lifecycle.requeue(message, token, min(until, message.deliver_until), EventKind.WAITING,
                      detail={"why": instance.health_state, "instance": instance.name})
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


def resolve_lost_answer(message: Message, token: uuid.UUID) -> str | None:
    """An earlier answer was lost: decide on Evolution's records (sending.evidence) whether that send
    went out. None: it did not, the lease is renewed and this claim may send; otherwise what was done."""
    verdict = evidence.judge(message)
    now = timezone.now()
    checked = {"verdict": verdict.kind, **({"why": verdict.why} if verdict.why else {}), **verdict.detail}
    if verdict.kind == evidence.TOO_SOON:
        # Not a retry and no wait of the message's own: asked again once Evolution has settled, even past deadline.
        at = datetime.fromisoformat(verdict.detail["at"])
        lifecycle.requeue(message, token, at, EventKind.WAITING,
                          detail={"why": "answer lost: Evolution is asked once it has settled", **verdict.detail})
        return "unknown"
    if verdict.kind == evidence.SENT:
        key = verdict.record["key"]
        if verdict.detail.get("by") == "ownId":
            note_id_honoured(message, message.instance, str(key["id"]))
        line = TimelineLine(
            EventKind.CHECKED, {**checked, "evolutionMessageId": key["id"],
                                "messageTimestamp": verdict.record.get("messageTimestamp")}, now,
        )
        try:
            with transaction.atomic():
                done = lifecycle.mark_sent(
                    message, token, str(key["id"]), str(key.get("remoteJid", "")),
                    {"outcome": "sent", "confirmedBy": "findMessages"}, attempt_line=line,
                ) or lifecycle.answer_after_receipts(
                    message, token, str(key["id"]), str(key.get("remoteJid", "")),
                    {"outcome": "sent", "confirmedBy": "findMessages"},
                )
        except IntegrityError:
            # Another message took that record meanwhile: it is not this one's to take.
            verdict = evidence.Verdict(evidence.UNKNOWN, why="the record became another message's meanwhile")
        else:
            return "confirmed_sent" if done else LEASE_LOST
    if verdict.kind == evidence.NOT_SENT:
        line = TimelineLine(EventKind.CHECKED, checked, now)
        if message.deliver_until <= now or message.attempts >= message.max_attempts:
            expired = message.deliver_until <= now
            message.record(line.kind, **line.detail)
            lifecycle.fail(
                message,
                FailureReason.EXPIRED if expired else FailureReason.RETRIES_EXHAUSTED,
                ("deliverUntil passed" if expired else f"{message.attempts} attempts failed")
                + "; the last attempt was not sent (findMessages)",
                message.last_gateway_response, lease_token=token, extra_update=dict(lifecycle.UNKNOWN_CLEARED),
            )
            return "failed"
        # The check took part of the lease: renew it for the send this claim goes on to make.
        if not lifecycle.settle_not_sent(message, token, timezone.now() + timedelta(seconds=lease_seconds()), line):
            return LEASE_LOST
        return None
    return _stay_unknown(message, token, verdict, now)


def _stay_unknown(message: Message, token: uuid.UUID, verdict: evidence.Verdict, now: datetime) -> str:
    """Neither sent again nor marked sent: ask again later, or fail OUTCOME_UNKNOWN once the deadline
    or the attempt budget is gone."""
    since = message.outcome_unknown_since or now
    mark = {"outcome_unknown_since": since}
    metrics.messages(f"outcome_unknown:{message.lane}")
    if message.deliver_until <= now or message.attempts >= message.max_attempts:
        lifecycle.fail(
            message, FailureReason.OUTCOME_UNKNOWN,
            f"an answer from Evolution was lost and the message may have been delivered: {verdict.why}",
            {"outcome": "unknown", "why": verdict.why, **verdict.detail},
            lease_token=token, extra_update=mark,
        )
        return "outcome_unknown"
    # Ask again later (another message may claim a candidate, Evolution may come back): sooner at first.
    wait = timedelta(seconds=min(max(settings.UNCONFIRMED_SETTLE_SECONDS, (now - since).total_seconds()), 300))
    lifecycle.requeue(
        message, token, min(now + wait, message.deliver_until), EventKind.WAITING,
        detail={"why": "outcome of the last attempt unknown", "check": verdict.why, **verdict.detail},
        extra_update=mark,
    )
    return "unknown"


def apply_outcome(
    message: Message, token: uuid.UUID, instance: Instance, outcome: gateway.Outcome, started: datetime | None = None
) -> str:
    now = timezone.now()
    record = outcome.as_record()
    metrics.messages(f"attempt:{outcome.kind}:{message.lane}")
    if outcome.kind == gateway.SENT:
        attempts = message.attempts + 1
        changes: dict[str, object] = {"attempts": attempts}
        if not outcome.extra.get("simulated"):
            note_id_honoured(message, instance, outcome.message_id)
        line = TimelineLine(EventKind.ATTEMPT, {"attempt": attempts, "instance": instance.name, **record}, now)
        if not lifecycle.mark_sent(message, token, outcome.message_id, outcome.remote_jid, record,
                                   extra_update=changes, attempt_line=line):
            if lifecycle.answer_after_receipts(message, token, outcome.message_id, outcome.remote_jid, record,
                                               extra_update=changes):
                return "sent"
            return _sent_after_losing_lease(message, outcome, record, changes)
        if instance.last_gateway_error:
            Instance.objects.filter(pk=instance.pk).update(last_gateway_error="", last_gateway_error_at=None)
        return "sent"

    if outcome.kind == gateway.DISCONNECTED:
        # A Connection Closed answer is fresher evidence than connectionState, which can still
        # say `open` over a dead socket: believe it for the lane's whole smart wait, or every
        # waiting message would be sent again (and refused) each time the short cache expires.
        wait_seconds = routing.DISCONNECTED_WAIT[message.lane].total_seconds()
        instance_state.sync(instance, "close")
        # After sync: the cache must be at least as new as the row's state change to count.
        instance_state.remember(instance.name, "close", ttl=max(settings.INSTANCE_STATE_CACHE_SECONDS, wait_seconds))
        # With an open fallback the next claim re-routes at once; otherwise wait for a reconnect.
        wait = timedelta(0) if routing.has_fallback(message) else routing.DISCONNECTED_WAIT[message.lane]
        lifecycle.requeue(
            message, token, min(now + wait, message.deliver_until), EventKind.WAITING,
            detail={"why": routing.NOT_CONNECTED, "instance": instance.name, **record},
        )
        # A storm of these rests the number (messaging.governor).
        governor.safely(governor.connection_closed, instance.pk)
        return "waiting"

    if outcome.kind == gateway.MISCONFIGURED:
        report_misconfiguration(instance, outcome)
        lifecycle.requeue(
            message, token, min(now + MISCONFIGURED_WAIT, message.deliver_until), EventKind.WAITING,
            detail={"why": "gateway configuration fault", **record},
        )
        return "waiting"

    attempts = message.attempts + 1
    message.record(EventKind.ATTEMPT, attempt=attempts, instance=instance.name, **record)
    if outcome.kind == gateway.PERMANENT:
        lifecycle.fail(
            message, outcome.reason or FailureReason.REJECTED, outcome.detail, record,
            lease_token=token, extra_update={"attempts": attempts},
        )
        return "failed"

    # transient or unknown: an attempt is used; retry later if one fits.
    extra: dict[str, object] = {"attempts": attempts}
    if outcome.kind == gateway.UNKNOWN:
        # The send may have gone out: the next claim asks Evolution about this attempt's window first.
        since, until = evidence.window(started or now - timedelta(seconds=settings.EVOLUTION_READ_TIMEOUT + 5), now)
        extra.update(unconfirmed_attempt_at=since, unconfirmed_attempt_until=until,
                     outcome_unknown_since=message.outcome_unknown_since or now)
        retry_at = backoff.next_attempt_at(attempts, now, message.deliver_until)
        if attempts >= message.max_attempts or retry_at is None:
            # No try is left, but the message is failed only once Evolution was asked (resolve_lost_answer).
            retry_at = now
        # Never asked before Evolution has settled: "not found by our id" means "not sent" only then.
        retry_at = max(retry_at, evidence.settled_at(until))
        if not lifecycle.requeue(
            message, token, retry_at, EventKind.WAITING,
            detail={"why": "answer lost: Evolution is asked before anything else", "attempt": attempts},
            extra_update=extra,
        ):
            return _overtaken(message, token, {"attempts": attempts}, record)
        return "retry"
    if attempts >= message.max_attempts:
        if not lifecycle.fail(
            message, FailureReason.RETRIES_EXHAUSTED, f"{attempts} attempts failed; last: {outcome.detail}",
            record, lease_token=token, extra_update=extra,
        ):
            return _overtaken(message, token, extra, record)
        return "failed"
    retry_at = backoff.next_attempt_at(attempts, now, message.deliver_until)
    if retry_at is None:
        lifecycle.fail(
            message, FailureReason.EXPIRED, f"no retry fits before deliverUntil; last: {outcome.detail}",
            record, lease_token=token, extra_update=extra,
        )
        return "failed"
    if not lifecycle.requeue(
        message, token, retry_at, EventKind.WAITING,
        detail={"why": "retry after a transient failure", "attempt": attempts}, extra_update=extra,
    ):
        return _overtaken(message, token, extra, record)
    return "retry"


def _overtaken(message: Message, token: uuid.UUID, changes: dict[str, object], record: dict[str, object]) -> str:
    """A retry's write found the message moved on: receipts matched on its own id showed that the send went out
    while the answer was lost or an error. The attempt joins the message and its lease ends."""
    if lifecycle.answer_after_receipts(message, token, "", "", record, extra_update=changes):
        metrics.messages(f"answer_overtaken:{message.lane}")
        return "sent"
    return LEASE_LOST


def note_id_honoured(message: Message, instance: Instance, answered: str) -> None:
    """Whether the instance's Evolution sent with the id we chose, as its answer shows: kept on the instance
    (written only when it changes), and a mismatch logged. The answer's id is the one recorded either way."""
    asked = message.own_message_id
    if not asked or not answered:
        return
    honoured = answered == asked
    if not honoured:
        log.warning(
            "instance %s sent message %s as WhatsApp id %s, not the %s it was given (messageId): its Evolution "
            "ignores the field; lost answers on it are judged by inference", instance.name, message.pk, answered, asked,
        )
        metrics.evolution("gateway:message_id_ignored")
    if instance.honours_message_id is not honoured:
        Instance.objects.filter(pk=instance.pk).exclude(honours_message_id=honoured).update(honours_message_id=honoured)
        instance.honours_message_id = honoured


def _sent_after_losing_lease(
    message: Message, outcome: gateway.Outcome, record: dict[str, object], changes: dict[str, object]
) -> str:
    """Evolution sent it, but our lease was gone (the worker stalled past it and the reconciler took
    the message back). The send is the truth: record it while the message waits for another
    attempt; if another worker is already sending it, say so loudly."""
    metrics.messages(f"lease_lost:{message.lane}")
    if lifecycle.mark_sent(message, None, outcome.message_id, outcome.remote_jid, record,
                           extra_update=changes, from_statuses=(Status.QUEUED,)):
        log.error("message %s was sent after its lease ran out; recorded as SENT", message.pk)
    elif Message.objects.filter(pk=message.pk, status=Status.FAILED, lease_token__isnull=True).exists():
        # An ERROR receipt matched on its own id overtook the answer: WhatsApp refused what was sent.
        log.warning("message %s: sendText answered after WhatsApp's error for it; it stays FAILED", message.pk)
    else:
        log.error("message %s was sent after its lease ran out and another worker holds it: it may be sent twice",
                  message.pk)
    return LEASE_LOST


def report_misconfiguration(instance: Instance, outcome: gateway.Outcome) -> None:
    """Loud on purpose: an error log, a counter, and the instance's row in admin."""
    log.error(
        "Evolution refused our request for instance %s (HTTP %s: %s): check EVOLUTION_API_KEY / the instance token",
        instance.name, outcome.status_code, outcome.detail,
    )
    metrics.evolution("gateway:misconfigured")
    Instance.objects.filter(pk=instance.pk).update(
        last_gateway_error=f"HTTP {outcome.status_code}: {outcome.detail}"[:500], last_gateway_error_at=timezone.now()
    )
