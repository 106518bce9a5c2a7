"""The life of a message: its states, the moves between them (MOVES), and one function per move that writes it.

    accept → QUEUED → claim → SENDING → mark_sent → SENT → advance (a receipt) → SERVER_ACK → DELIVERED → READ
    SENDING → requeue → QUEUED (a retry, a hold, a recovered lease);  FAILED → resend → QUEUED
    QUEUED, SENDING, SENT, SERVER_ACK → fail (or expire, withdraw) → FAILED, always with a dead letter

Every move is a compare-and-set on the statuses MOVES lets it start from (and on the worker's lease where a worker
acts): two workers, a worker and a reconciler, or a replayed task never both win; a move that returns False wrote
nothing. The trigger `message_status_order` holds the same table for any UPDATE, and no other module writes a status
(tests/messaging/test_lifecycle.py checks both). messaging.writes and .inserts hold the SQL, one statement per hot move.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import django.dispatch
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from pilot_status import observe

from . import consent, inserts, writes
from .holds import hold_reason
from .models import EventKind, IdempotencyRecord, Message, MessageEvent, OutboxEntry, Status
from .writes import FillEmpty, KeepEarlier, TimelineLine

QUEUED, SENDING, SENT, SERVER_ACK = Status.QUEUED, Status.SENDING, Status.SENT, Status.SERVER_ACK
DELIVERED, READ, FAILED = Status.DELIVERED, Status.READ, Status.FAILED


@dataclass(frozen=True)
class Move:
    name: str  # the function below that writes it
    sources: tuple[Status, ...]  # the statuses it may start from (none: a new message)
    target: Status | None  # the status it ends in (None: the status stays)


MOVES = (
    Move("accept", (), QUEUED),  # with its ACCEPTED line and outbox entry (and the Idempotency-Key's answer)
    Move("release", (QUEUED,), None),  # the relay hands it to its lane: dispatched_at, a DISPATCHED line
    Move("redispatch", (QUEUED,), None),  # released but never claimed (the broker lost it): released again
    Move("hold", (QUEUED,), None),  # the relay keeps it in the outbox for its number's sending policy: a WAITING line
    Move("claim", (QUEUED,), SENDING),  # a worker's lease
    Move("settle_not_sent", (SENDING,), None),  # a lost answer proved not sent: the claim goes on to send
    Move("requeue", (SENDING,), QUEUED),  # a retry (an attempt used), a hold (none), a recovered lease
    Move("mark_sent", (SENDING, QUEUED), SENT),  # QUEUED: the answer came after its lease had run out
    Move("answer_after_receipts", (SERVER_ACK, DELIVERED, READ), None),  # receipts on its own id beat sendText's answer
    # Receipts (a webhook, status sync, a TEST number's): forward only, from any earlier status.
    Move("advance", (QUEUED, SENDING), SENT),
    Move("advance", (QUEUED, SENDING, SENT), SERVER_ACK),
    Move("advance", (QUEUED, SENDING, SENT, SERVER_ACK), DELIVERED),
    Move("advance", (QUEUED, SENDING, SENT, SERVER_ACK, DELIVERED), READ),
    Move("stop_status_sync", (SENT, SERVER_ACK), None),  # no receipt for days: status sync stops asking
    Move("flag_unacknowledged", (SENT,), None),  # no SERVER_ACK within ACK_TIMEOUT_SECONDS: flagged, status kept
    Move("fail", (QUEUED, SENDING, SENT, SERVER_ACK), FAILED),  # SENT, SERVER_ACK: an ERROR receipt
    Move("expire", (QUEUED,), FAILED),  # its deadline passed while it waited
    Move("withdraw", (QUEUED,), FAILED),  # its recipient opted out before it was sent
    Move("resend", (FAILED,), QUEUED),  # a person's force resend: a fresh budget and deadline
)
# Delivery progress, each step with the column that stamps it.
STAMPS = {SENT: "sent_at", SERVER_ACK: "server_ack_at", DELIVERED: "delivered_at", READ: "read_at"}
PROGRESS = list(STAMPS)
# Every move that takes a message out of a worker's hands ends its lease.
LEASE_ENDED: dict[str, Any] = {"lease_token": None, "lease_expires_at": None}
# The marks of an attempt whose answer was lost (its window; since when its outcome is unknown), settled.
UNKNOWN_CLEARED = dict.fromkeys(("unconfirmed_attempt_at", "unconfirmed_attempt_until", "outcome_unknown_since"))

# Sent once a send's Evolution id is committed: ingestion (listening) applies the receipts that raced ahead of it.
message_sent = django.dispatch.Signal()


@functools.cache
def sources(name: str, target: str | None = None, within: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The statuses move `name` (towards `target`, for a receipt) may start from, or the subset `within` asked for."""
    [move] = [m for m in MOVES if m.name == name and (target is None or m.target == target)]
    allowed = tuple(status.value for status in move.sources)
    narrowed = allowed if within is None else tuple(Status(status).value for status in within)
    assert set(narrowed) <= set(allowed), f"{name} may not start from {narrowed}"
    return narrowed


def accept(message: Message, line: MessageEvent, entry: OutboxEntry, claim: IdempotencyRecord | None,
           cutoff: datetime, guard: tuple[str, list[Any]] | None = None) -> bool:
    """A new message enters QUEUED with its ACCEPTED line, outbox entry and Idempotency-Key answer (`claim`, replacing
    one older than `cutoff`) in one statement; False (nothing written) when the key has a live answer or `guard` fails."""
    message.status = QUEUED
    return inserts.insert_rows([message, line, entry], claim, cutoff, guard)


def release(entry_ids: list[int], lane: str, now: datetime) -> None:
    """The relay hands due entries to `lane` in its pass's transaction: they leave the outbox, each message still QUEUED
    stamped with a DISPATCHED line, its row locked until the pass commits (no DISPATCHED line after an attempt's)."""
    writes.release_rows(entry_ids, sources("release")[0], now, EventKind.DISPATCHED, {"lane": lane})


def redispatch(message: Message, now: datetime) -> bool:
    """Released, but never claimed (the broker lost the task): into the outbox again, with a RECOVERED line.
    dispatched_at is cleared under its old value, so a concurrent pass does nothing."""
    with transaction.atomic():
        if not writes.clear_dispatched(message.pk, sources("redispatch"), message.dispatched_at):
            return False
        message.record(EventKind.RECOVERED, why="released but never claimed")
        inserts.enqueue(message, now)
    return True


def hold(entry_ids: list[int], holds: dict[str, tuple[datetime, str, dict[str, Any]]], now: datetime) -> None:
    """The relay keeps the entries until their number may send: each message {id: (until, hold reason, WAITING
    detail)} is due then, with a WAITING line when its reason changed, in one statement."""
    writes.hold_rows(entry_ids, holds, sources("hold")[0], now, EventKind.WAITING)


def claim(message_id: str, token: uuid.UUID, now: datetime, due_by: datetime,
          lease_until: datetime, own_id: str) -> tuple[Message, bool] | None:
    """QUEUED → SENDING under the lease `token` if due by `due_by` (`own_id` its WhatsApp id if it has none), in one
    statement: the message with instance and project, and whether its consent holds; None if not claimed."""
    [queued] = sources("claim")
    claimed = writes.claim_row(message_id, queued, SENDING.value, token, now, due_by, lease_until, own_id,
                               extra=consent.OPTED_IN_AT_CLAIM)
    return None if claimed is None else (claimed[0], bool(claimed[1]))


def settle_not_sent(message: Message, token: uuid.UUID, lease_until: datetime, line: TimelineLine) -> bool:
    """A lost answer's send proved not sent (`line`, CHECKED): the unknown marks go, the lease is renewed for the send
    this claim goes on to make, the message stays SENDING."""
    changes = {"lease_expires_at": lease_until, **UNKNOWN_CLEARED}
    if not writes.compare_and_set(message.pk, sources("settle_not_sent"), token, changes, [line]):
        return False
    vars(message).update(changes)
    return True


def requeue(message: Message, lease_token: uuid.UUID | None, available_at: datetime, kind: str,
            detail: dict[str, Any], extra_update: dict[str, Any] | None = None) -> bool:
    """SENDING → QUEUED into the outbox, due at `available_at`: a retry (its attempt in `extra_update`), a hold or a
    recovered lease (`kind` RECOVERED). A hold is listed (WAITING) only when its reason (messaging.holds) changed."""
    hold = hold_reason(kind, detail, extra_update)
    repeated = hold is not None and hold == message.hold_reason  # as claimed, under this lease
    with transaction.atomic():
        if not writes.update_if(message.pk, sources("requeue"), lease_token, status=QUEUED, **LEASE_ENDED,
                                next_attempt_at=available_at, dispatched_at=None, hold_reason=hold,
                                **(extra_update or {})):
            return False
        message.refresh_from_db()
        if not repeated:
            message.record(kind, next_attempt_at=available_at.isoformat(), **detail)
        inserts.enqueue(message, available_at)  # out of the broker: the relay releases it again from this entry
    return True


def mark_sent(message: Message, lease_token: uuid.UUID | None, evolution_message_id: str, remote_jid: str,
              attempt_detail: dict[str, Any], extra_update: dict[str, Any] | None = None,
              attempt_line: TimelineLine | None = None, from_statuses: tuple[str, ...] = (SENDING,)) -> bool:
    """SENDING → SENT (from QUEUED: the answer came after the lease ran out) with the attempt's line (if given) and
    the status line, unknown marks settled: one statement, the hot path of every message."""
    now = timezone.now()
    changes: dict[str, Any] = {"status": SENT, "sent_at": now, "updated_at": now, "remote_jid": remote_jid,
                               "evolution_message_id": evolution_message_id, "last_gateway_response": attempt_detail,
                               **LEASE_ENDED, "hold_reason": None, **UNKNOWN_CLEARED, **(extra_update or {})}
    status_line = TimelineLine(EventKind.STATUS, {"status": SENT, "evolutionMessageId": evolution_message_id}, now)
    lines = [attempt_line, status_line] if attempt_line else [status_line]
    if not writes.compare_and_set(message.pk, sources("mark_sent", within=tuple(from_statuses)), lease_token, changes, lines):
        if attempt_line is not None:  # the lease was lost meanwhile, but the attempt happened: the timeline keeps it
            message.record(attempt_line.kind, **attempt_line.detail)
        return False
    vars(message).update(changes)
    if (created_at := message.__dict__.get("created_at")) is not None:  # loaded by the claim; never a query of its own
        observe.observe(observe.ACCEPT_TO_SENT, message.lane, (now - created_at).total_seconds())
    message_sent.send(sender=Message, message=message)
    return True


def answer_after_receipts(message: Message, lease_token: uuid.UUID, evolution_message_id: str, remote_jid: str,
                          attempt_detail: dict[str, Any], extra_update: dict[str, Any] | None = None) -> bool:
    """Receipts on its own id moved it past SENT before the worker recorded sendText's answer: the answer joins it
    (attempt, id, jid, a send time if none), the lease ends, the status stays. The line is the caller's."""
    now = timezone.now()
    changes: dict[str, Any] = {"sent_at": KeepEarlier(now), "updated_at": now, "last_gateway_response": attempt_detail,
                               **LEASE_ENDED, "hold_reason": None, **UNKNOWN_CLEARED, **(extra_update or {})}
    changes.update({k: v for k, v in (("evolution_message_id", evolution_message_id), ("remote_jid", remote_jid)) if v})
    if not writes.compare_and_set(message.pk, sources("answer_after_receipts"), lease_token, changes):
        return False
    message.refresh_from_db()
    message_sent.send(sender=Message, message=message)
    return True


def _progress(status: str, at: datetime, detail: dict[str, Any],
              key_id: str = "") -> tuple[Any, dict[str, Any], list[TimelineLine]]:
    """A receipt's sources, columns and STATUS line. It implies the steps it overtook (the channels race), their times
    filled while empty, and proves the send: a lost answer's marks go, its own id `key_id` becomes Evolution's."""
    target = Status(status)
    implied = {STAMPS[earlier]: KeepEarlier(at) for earlier in PROGRESS[1 : PROGRESS.index(target)]}
    changes = {"status": status, "updated_at": at, **implied, STAMPS[target]: at, **UNKNOWN_CLEARED}
    if key_id:
        changes["evolution_message_id"] = FillEmpty(key_id)
    return sources("advance", target), changes, [TimelineLine(EventKind.STATUS, {"status": status, **detail}, at)]


def advance(message: Message, status: str, at: datetime | None = None, key_id: str = "", **detail: Any) -> bool:
    """A receipt moves delivery forward to `status` with its STATUS line in one statement; a late one does nothing. One
    that comes before the send's answer is recorded (QUEUED, SENDING) proves the send: SENT first, with its own line."""
    at = at or timezone.now()
    before, changes, lines = _progress(status, at, detail, key_id)
    unanswered = message.status in (QUEUED, SENDING)
    before = tuple(s for s in before if (s in (QUEUED, SENDING)) == unanswered)
    if unanswered and status == SENT:  # its own line says so: one SENT line, one SENT callback
        lines[0].detail.update({"evolutionMessageId": key_id, "by": "receipt"} if key_id else {"by": "receipt"})
    elif unanswered:
        changes["sent_at"] = KeepEarlier(at)
        lines.insert(0, TimelineLine(EventKind.STATUS, {"status": SENT, "evolutionMessageId": key_id, "by": "receipt"}, at))
    if not writes.compare_and_set(message.pk, before, None, changes, lines):
        return False
    message.status = status
    setattr(message, STAMPS[Status(status)], at)
    return True


def advance_ctes(message_ref: str, status: str, at: datetime, key_id: str = "",
                 **detail: Any) -> tuple[str, list[Any], list[Any]]:
    """`advance` as CTEs (`changed`, `timeline`) of ingestion's one statement per receipt, for the message
    `message_ref` (SQL): with their parameters and lines."""
    before, changes, lines = _progress(status, at, detail, key_id)
    ctes, params = writes.compare_and_set_ctes(message_ref, [], before, None, changes, lines)
    return ctes, params, lines


def stop_status_sync(message: Message, now: datetime, why: str) -> bool:
    """Status sync stops asking about a message that had no receipt: stamped, one SYNC_STOPPED line, status kept."""
    line = TimelineLine(EventKind.SYNC_STOPPED, {"status": message.status, "why": why}, now)
    stamps = {"status_checked_at": now, "status_sync_stopped_at": now}
    return writes.compare_and_set(message.pk, sources("stop_status_sync"), None, stamps, [line])


def flag_unacknowledged(now: datetime, timeout_seconds: int, limit: int) -> int:
    """SENT before `now - timeout_seconds` with no receipt: at most `limit` (oldest first) stamped unacknowledged_at
    once, with an UNACKNOWLEDGED line each, status kept, in one statement; how many."""
    return writes.flag_unacknowledged_rows(sources("flag_unacknowledged")[0], now, timeout_seconds, limit,
                                           EventKind.UNACKNOWLEDGED)


def fail(message: Message, reason: str, detail: str, response: Any = None,
         from_statuses: tuple[str, ...] = (QUEUED, SENDING), lease_token: uuid.UUID | None = None,
         extra_update: dict[str, Any] | None = None) -> bool:
    """FAILED with a reason, a timeline entry and a dead letter, in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        if not writes.update_if(message.pk, sources("fail", within=tuple(from_statuses)), lease_token, status=FAILED,
                                **LEASE_ENDED, hold_reason=None, failure_reason=reason, failure_detail=detail[:2000],
                                failed_at=now, updated_at=now, last_gateway_response=response, **(extra_update or {})):
            return False
        message.refresh_from_db()
        message.record(EventKind.FAILED, reason=reason, detail=detail[:500])
        writes.open_dead_letter(message, reason, detail[:2000], response)
        message.record(EventKind.DEAD_LETTERED, reason=reason)
    return True


def expire(message: Message, reason: str, detail: str, response: Any = None, move: str = "expire") -> bool:
    """QUEUED → FAILED when its deadline passed while it waited (`reason` EXPIRED, or OUTCOME_UNKNOWN when its last
    answer was lost): as `fail`, and its outbox entry goes with it."""
    with transaction.atomic():
        if not fail(message, reason, detail, response, from_statuses=sources(move)):
            return False
        OutboxEntry.objects.filter(message=message).delete()
    return True


def withdraw(message: Message, reason: str, detail: str) -> bool:
    """QUEUED → FAILED before any send, as `expire`, because it may no longer go (`reason` OPTED_OUT: messaging.consent).
    One whose last answer was lost is left alone (it may have been sent: its claim asks Evolution first)."""
    with transaction.atomic():
        # Locked, so that the message cannot be claimed and its answer lost between this look and the update.
        return writes.lock_unanswered(message.pk, sources("withdraw")) and expire(message, reason, detail, move="withdraw")


def resend(message: Message, now: datetime, corrected: dict[str, Any], actor: str, /, **detail: Any) -> bool:
    """FAILED → QUEUED by a person's force resend: a fresh budget, due now, `corrected` (recipient, instance and
    deliverUntil as the funnel judged them), a RESENT line (`detail`), an outbox entry. Nothing of the failed send stays:
    its WhatsApp ids and receipts belong to that send (the next claim draws a new id)."""
    fresh = {"status": QUEUED, "attempts": 0, "max_attempts": settings.SEND_MAX_ATTEMPTS, "next_attempt_at": now,
             "dispatched_at": None, **LEASE_ENDED, **UNKNOWN_CLEARED, "failure_reason": "", "failure_detail": "",
             "failed_at": None, "last_gateway_response": None, "evolution_message_id": "", "own_message_id": "",
             "remote_jid": "", **dict.fromkeys(STAMPS.values()), "unacknowledged_at": None, "updated_at": now, **corrected}
    with transaction.atomic():
        if not writes.update_if(message.pk, sources("resend"), None, **fresh):
            return False
        message.refresh_from_db()
        message.record(EventKind.RESENT, actor=actor, **detail)
        inserts.enqueue(message, now)
    return True
