"""One send attempt for one message: claim the lease, ask the gateway, record what happened.

`send_one` is the whole unit of work behind the lane task; it is safe to run twice (the second
run finds nothing to claim) and returns what it did, so tests call it directly.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.utils import timezone
from psycopg.errors import LockNotAvailable
from psycopg_pool import PoolTimeout

from pilot_status import metrics
from pilot_status.database import checking_connection, release_while_waiting

from .. import lifecycle, test_numbers, writes
from ..models import EventKind, FailureReason, Instance, Message, Status
from . import backoff, breaker, budget, evidence, gateway, instance_state, pacing, routing, simulated, typing_delay

log = logging.getLogger(__name__)

# A 401 from Evolution is our configuration, not the message's fault: wait, shout, burn nothing.
MISCONFIGURED_WAIT = timedelta(seconds=30)

CLAIMED = "claimed"
NOTHING_TO_CLAIM = "nothing_to_claim"
LEASE_LOST = "lease_lost"

_UNKNOWN_CLEARED: dict[str, object] = {
    "unconfirmed_attempt_at": None, "unconfirmed_attempt_until": None, "outcome_unknown_since": None,
}


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


def claim(message_id: str) -> tuple[Message, uuid.UUID] | None:
    """QUEUED → SENDING with a lease; None when another worker has it or it is not due."""
    now = timezone.now()
    token = uuid.uuid4()
    # The claim doubles as the task's connection health check (one round trip less per send). Run
    # again on a replaced connection it is still safe: had the first one committed, the second finds
    # nothing to claim and the lease's expiry hands the message back (as after a crash).
    try:
        message = checking_connection(lambda: writes.claim(
            message_id,
            token,
            now,
            # One second of slack for clock skew between the relay's host and this one.
            due_by=now + timedelta(seconds=1),
            lease_until=now + timedelta(seconds=lease_seconds()),
        ))
    except OperationalError as exc:
        if isinstance(exc.__cause__, PoolTimeout):
            raise NoConnectionToClaim(str(exc)) from exc
        if isinstance(exc.__cause__, LockNotAvailable):
            raise ClaimLocked(str(exc)) from exc
        raise
    return None if message is None else (message, token)


def send_one(message_id: str) -> str:
    claimed = claim(message_id)
    if claimed is None:
        return NOTHING_TO_CLAIM
    message, token = claimed
    if message.unconfirmed_attempt_at is not None:
        # Before anything else, even past deliverUntil: a lost answer's send may have gone out.
        resolved = resolve_lost_answer(message, token)
        if resolved is not None:
            return resolved
    now = timezone.now()
    if message.deliver_until <= now:
        lifecycle.fail(
            message, FailureReason.EXPIRED, "deliverUntil passed before a send succeeded", lease_token=token
        )
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

    route = routing.choose(message, token)
    if isinstance(route, routing.Hold):
        metrics.messages(f"held:{route.why.replace(' ', '_')}:{message.lane}")
        lifecycle.requeue(
            message, token, route.until, EventKind.WAITING,
            detail={"why": route.why, **route.detail},
        )
        return "held"

    instance = route.instance
    if not take_send_slot(message, token, route):
        return "held"
    started = timezone.now()
    release_while_waiting()  # the call can take seconds (latency + typing): its connection serves others meanwhile
    outcome = gateway.send_text(instance.name, message.to, message.text, typing_delay.delay_ms_for(message))
    if outcome.kind == gateway.SENT and route.circuits_closed:
        # Recorded after the SENT is: the breakers' round trip is not part of an OTP's accept → SENT.
        done = record_answer(message, token, instance, outcome, started)
        breaker.record_successes([breaker.instance_scope(instance.name), breaker.GATEWAY])
        return done
    feed_breakers(instance, outcome)
    return record_answer(message, token, instance, outcome, started)


def record_answer(message: Message, token: uuid.UUID, instance: Instance, outcome: gateway.Outcome,
                  started: datetime) -> str:
    """apply_outcome for the answer of a call just made, waiting for a pooled connection as long as the lease
    lasts. The answer is the one proof of what Evolution did: a thread that gave its connection back for the
    call (release_while_waiting) and finds none free within the pool's wait must not drop it, or the message
    stays SENDING until its lease runs out and Evolution is asked about it. Waiting again is safe: the pool
    gave nothing, so nothing was written, and every write here is compare-and-set on the lease."""
    while True:
        try:
            return apply_outcome(message, token, instance, outcome, started)
        except OperationalError as exc:
            lease_left = message.lease_expires_at is not None and timezone.now() < message.lease_expires_at
            if not (isinstance(exc.__cause__, PoolTimeout) and lease_left):
                raise
            metrics.messages(f"answer_waits_for_connection:{message.lane}")


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
    wait = pacing.send_slot(instance.pk, instance.send_rate_per_second, priority=message.lane == "otp")
    if wait < 0:
        if not route.circuits_closed:  # a half-open circuit's probe this send took does not get to run
            breaker.record(breaker.instance_scope(instance.name), breaker.NEUTRAL)
            breaker.record(breaker.GATEWAY, breaker.NEUTRAL)
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
    if verdict.kind == evidence.SENT:
        key = verdict.record["key"]
        line = writes.TimelineLine(
            EventKind.CHECKED, {**checked, "evolutionMessageId": key["id"],
                                "messageTimestamp": verdict.record.get("messageTimestamp")}, now,
        )
        try:
            with transaction.atomic():
                done = lifecycle.mark_sent(
                    message, token, str(key["id"]), str(key.get("remoteJid", "")),
                    {"outcome": "sent", "confirmedBy": "findMessages"},
                    extra_update=dict(_UNKNOWN_CLEARED), attempt_line=line,
                )
        except IntegrityError:
            # Another message took that record meanwhile: it is not this one's to take.
            verdict = evidence.Verdict(evidence.UNKNOWN, why="the record became another message's meanwhile")
        else:
            return "confirmed_sent" if done else LEASE_LOST
    if verdict.kind == evidence.NOT_SENT:
        line = writes.TimelineLine(EventKind.CHECKED, checked, now)
        if message.deliver_until <= now or message.attempts >= message.max_attempts:
            expired = message.deliver_until <= now
            message.record(line.kind, **line.detail)
            lifecycle.fail(
                message,
                FailureReason.EXPIRED if expired else FailureReason.RETRIES_EXHAUSTED,
                ("deliverUntil passed" if expired else f"{message.attempts} attempts failed")
                + "; the last attempt was not sent (findMessages)",
                message.last_gateway_response, lease_token=token, extra_update=dict(_UNKNOWN_CLEARED),
            )
            return "failed"
        # The check took part of the lease: renew it for the send this claim goes on to make.
        renewed = {"lease_expires_at": timezone.now() + timedelta(seconds=lease_seconds()), **_UNKNOWN_CLEARED}
        if not writes.compare_and_set(message.pk, (Status.SENDING,), token, renewed, [line]):
            return LEASE_LOST
        message.unconfirmed_attempt_at = message.unconfirmed_attempt_until = message.outcome_unknown_since = None
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
        changes: dict[str, object] = {"attempts": attempts, **_UNKNOWN_CLEARED}
        line = writes.TimelineLine(EventKind.ATTEMPT, {"attempt": attempts, "instance": instance.name, **record}, now)
        if not lifecycle.mark_sent(message, token, outcome.message_id, outcome.remote_jid, record,
                                   extra_update=changes, attempt_line=line):
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
            retry_at = now + timedelta(seconds=settings.UNCONFIRMED_SETTLE_SECONDS)
        lifecycle.requeue(
            message, token, retry_at, EventKind.WAITING,
            detail={"why": "answer lost: Evolution is asked before anything else", "attempt": attempts},
            extra_update=extra,
        )
        return "retry"
    if attempts >= message.max_attempts:
        lifecycle.fail(
            message, FailureReason.RETRIES_EXHAUSTED, f"{attempts} attempts failed; last: {outcome.detail}",
            record, lease_token=token, extra_update=extra,
        )
        return "failed"
    retry_at = backoff.next_attempt_at(attempts, now, message.deliver_until)
    if retry_at is None:
        lifecycle.fail(
            message, FailureReason.EXPIRED, f"no retry fits before deliverUntil; last: {outcome.detail}",
            record, lease_token=token, extra_update=extra,
        )
        return "failed"
    lifecycle.requeue(
        message, token, retry_at, EventKind.WAITING,
        detail={"why": "retry after a transient failure", "attempt": attempts}, extra_update=extra,
    )
    return "retry"


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
