"""The life of a message: its states, the moves between them (MOVES), and one function per move that writes it.

    accept → QUEUED → claim → SENDING → mark_sent → SENT → advance → SERVER_ACK → DELIVERED → READ
    SENDING → requeue → QUEUED (a retry, a hold, a recovered lease);  FAILED → resend → QUEUED
    QUEUED, SENDING, SENT, SERVER_ACK → fail (or expire, withdraw) → FAILED, always with a dead letter

Every move is a compare-and-set on the statuses MOVES lets it start from (and on the worker's lease where a
worker acts), so two workers, a worker and a reconciler, or a replayed task never both win; a move that returns
False wrote nothing. Postgres holds the same table for any UPDATE (the trigger `message_status_order`), and no
other module writes a status (tests/messaging/test_lifecycle.py checks both). messaging.writes and .inserts turn
moves into SQL; the hot ones (release, claim, mark_sent, advance) are one statement each (bench B2, B5).
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import django.dispatch
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from pilot_status import observe

from . import consent, inserts, writes
from .models import DeadLetter, EventKind, IdempotencyRecord, Message, MessageEvent, OutboxEntry, Status
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
    # Receipts matched on the message's own id moved it on before the worker recorded sendText's answer.
    Move("answer_after_receipts", (SERVER_ACK, DELIVERED, READ), None),
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

# Sent once a message's Evolution id is committed: receipts that raced ahead of the send (ingestion stores them)
# can now be applied. Ingestion listens; the domain does not import it.
message_sent = django.dispatch.Signal()


@functools.cache
def sources(name: str, target: str | None = None, within: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The statuses move `name` (towards `target`, for a receipt) may start from, or the narrower set `within`
    them that a caller asks for."""
    [move] = [m for m in MOVES if m.name == name and (target is None or m.target == target)]
    allowed = tuple(status.value for status in move.sources)
    narrowed = allowed if within is None else tuple(Status(status).value for status in within)
    assert set(narrowed) <= set(allowed), f"{name} may not start from {narrowed}"
    return narrowed


def accept(message: Message, line: MessageEvent, entry: OutboxEntry, claim: IdempotencyRecord | None,
           cutoff: datetime, guard: tuple[str, list[Any]] | None = None) -> bool:
    """A new message enters QUEUED with its ACCEPTED line and its outbox entry, and the Idempotency-Key's answer
    (`claim`, replacing one older than `cutoff`): all or nothing, in one statement with the relay's NOTIFY. False
    when the key has a live answer or `guard` (SQL and parameters) does not hold: nothing was written."""
    message.status = QUEUED
    return inserts.insert_rows([message, line, entry], claim, cutoff, guard)


_RELEASED = """
WITH released AS (
    DELETE FROM messaging_outboxentry WHERE id = ANY(%(ids)s) RETURNING message_id
), stamped AS (
    -- Only a queued message is stamped and listed: an entry whose release the broker confirmed but that never
    -- committed (the relay's connection lost at the commit) is back while its task sends the message; released
    -- again later, it leaves the outbox with no stamp and no line after the send, and its task claims nothing.
    -- = ANY(ARRAY(...)), not IN (SELECT ...), and the status tested in the SET, not the WHERE: the primary key's
    -- index whatever the statistics say (tests/messaging/test_relay_plans.py).
    UPDATE messaging_message
       SET dispatched_at = CASE WHEN status = %(queued)s THEN %(now)s ELSE dispatched_at END
     WHERE id = ANY(ARRAY(SELECT message_id FROM released))
    RETURNING id, hold_reason, status
)
-- Never stamped before the commit that made the entry visible (clock_timestamp()): a pass that read its clock
-- before an accept or a resend committed still lists DISPATCHED after it. A held message gets no line (requeue).
INSERT INTO messaging_messageevent (message_id, kind, actor, detail, created_at)
SELECT id, %(kind)s, '', %(detail)s::jsonb, GREATEST(%(now)s, clock_timestamp()) FROM stamped
 WHERE hold_reason IS NULL AND status = %(queued)s
"""


def release(entry_ids: list[int], lane: str, now: datetime) -> None:
    """The relay hands due entries to `lane` inside its pass's transaction, in one statement: they leave the outbox,
    and each message still QUEUED is stamped dispatched with a DISPATCHED line. Its row stays locked until the
    pass commits, so a worker's claim waits: no DISPATCHED line after an attempt's."""
    [queued] = sources("release")
    with connection.cursor() as cursor:
        cursor.execute(_RELEASED, {"ids": entry_ids, "now": now, "kind": EventKind.DISPATCHED, "queued": queued,
                                   "detail": json.dumps({"lane": lane})})


def redispatch(message: Message, now: datetime) -> bool:
    """Released, but never claimed (the broker lost the task): into the outbox again, with a RECOVERED line.
    dispatched_at is cleared under its old value, so a concurrent pass does nothing."""
    with transaction.atomic():
        rows = Message.objects.filter(pk=message.pk, status__in=sources("redispatch"), dispatched_at=message.dispatched_at)
        if not rows.update(dispatched_at=None):
            return False
        message.record(EventKind.RECOVERED, why="released but never claimed")
        inserts.enqueue(message, now)
    return True


_HELD = """
WITH v AS (SELECT * FROM unnest(%(ids)s::uuid[], %(untils)s::timestamptz[], %(reasons)s::text[], %(details)s::jsonb[])
             AS v(id, until, reason, detail)),
moved AS (UPDATE messaging_outboxentry SET available_at = v.until FROM v
           WHERE messaging_outboxentry.id = ANY(%(entries)s) AND messaging_outboxentry.message_id = v.id),
held AS (UPDATE messaging_message m SET next_attempt_at = v.until, hold_reason = v.reason FROM v, messaging_message old
          WHERE m.id = v.id AND old.id = v.id AND m.status = %(queued)s
      RETURNING m.id, v.detail, old.hold_reason IS DISTINCT FROM v.reason AS changed)
INSERT INTO messaging_messageevent (message_id, kind, actor, detail, created_at)
SELECT id, %(kind)s, '', detail, %(now)s FROM held WHERE changed
"""


def hold(entry_ids: list[int], holds: dict[str, tuple[datetime, str, dict[str, Any]]], now: datetime) -> None:
    """The relay keeps these entries in the outbox until their number may send, in one statement: each message
    {id: (until, hold reason, WAITING detail)} is due then, with a WAITING line when its reason changed."""
    [queued] = sources("hold")
    ids = list(holds)
    cursor_params: dict[str, Any] = {"ids": ids, "untils": [holds[i][0] for i in ids], "reasons": [holds[i][1] for i in ids],
                     "details": [json.dumps({**holds[i][2], "next_attempt_at": holds[i][0].isoformat()}) for i in ids],
                     "entries": entry_ids, "queued": queued, "kind": EventKind.WAITING, "now": now}
    with connection.cursor() as cursor:
        cursor.execute(_HELD, cursor_params)


_CLAIM = """
UPDATE messaging_message
   SET status = %(to)s, lease_token = %(token)s, lease_expires_at = %(lease_until)s, updated_at = %(now)s,
       own_message_id = CASE WHEN own_message_id = '' THEN %(own_id)s ELSE own_message_id END
 WHERE id = %(id)s AND status = %(from)s AND next_attempt_at <= %(due_by)s
RETURNING *"""


def claim(message_id: str, token: uuid.UUID, now: datetime, due_by: datetime,
          lease_until: datetime, own_id: str) -> tuple[Message, bool] | None:
    """QUEUED → SENDING under the worker's lease `token` if due by `due_by`: the message with its instance and
    project loaded, and whether its recipient's consent still holds (messaging.consent), in one statement (a message
    without a WhatsApp id of its own takes `own_id`, before any attempt); None when another worker has it or it is
    not due."""
    [queued] = sources("claim")
    claimed = writes.changed_with_relations(
        _CLAIM, {"to": SENDING.value, "from": queued, "token": token, "now": now, "lease_until": lease_until,
                 "id": message_id, "due_by": due_by, "own_id": own_id},
        extra=consent.OPTED_IN_AT_CLAIM,
    )
    return None if claimed is None else (claimed[0], bool(claimed[1]))


def settle_not_sent(message: Message, token: uuid.UUID, lease_until: datetime, line: TimelineLine) -> bool:
    """Evolution's records show that a lost answer's send did not go out (`line`, CHECKED): the unknown marks go
    and the lease is renewed for the send this claim goes on to make. The message stays SENDING."""
    changes = {"lease_expires_at": lease_until, **UNKNOWN_CLEARED}
    if not writes.compare_and_set(message.pk, sources("settle_not_sent"), token, changes, [line]):
        return False
    vars(message).update(changes)
    return True


def requeue(message: Message, lease_token: uuid.UUID | None, available_at: datetime, kind: str,
            detail: dict[str, Any], extra_update: dict[str, Any] | None = None) -> bool:
    """SENDING → QUEUED, due at `available_at`, into the outbox: a retry (the caller counts the attempt in
    `extra_update`), a hold (no attempt used) or a recovered lease (`kind` RECOVERED). A hold writes its WAITING
    line only when its reason differs from the hold the message was in (`hold_reason`), and the relay writes no
    DISPATCHED line for a held one: one line per change of reason, not two per cycle."""
    hold = hold_reason(kind, detail, extra_update)
    repeated = hold is not None and hold == message.hold_reason  # as claimed, under this lease
    with transaction.atomic():
        # Not in the broker any more: the relay releases it again from the new outbox row.
        if not writes.update_if(message.pk, sources("requeue"), lease_token, status=QUEUED, **LEASE_ENDED,
                                next_attempt_at=available_at, dispatched_at=None, hold_reason=hold,
                                **(extra_update or {})):
            return False
        message.refresh_from_db()
        if not repeated:
            message.record(kind, next_attempt_at=available_at.isoformat(), **detail)
        inserts.enqueue(message, available_at)
    return True


def hold_reason(kind: str, detail: dict[str, Any], extra_update: dict[str, Any] | None) -> str | None:
    """What holds a message back as one comparable string (why, and the instance or circuit it concerns); None
    when a requeue is no hold: a retry uses an attempt, and a recovery is no wait."""
    if kind != EventKind.WAITING or "attempts" in (extra_update or {}):
        return None
    return "|".join(str(detail.get(key, "")) for key in ("why", "instance", "circuit"))[:200]


def mark_sent(message: Message, lease_token: uuid.UUID | None, evolution_message_id: str, remote_jid: str,
              attempt_detail: dict[str, Any], extra_update: dict[str, Any] | None = None,
              attempt_line: TimelineLine | None = None, from_statuses: tuple[str, ...] = (SENDING,)) -> bool:
    """SENDING → SENT (from QUEUED: the answer came after the lease ran out) with the attempt's line (if given) and
    the status line, unknown marks settled: one statement, the hot path of every message."""
    now = timezone.now()
    changes: dict[str, Any] = {
        "status": SENT, "sent_at": now, "updated_at": now, "evolution_message_id": evolution_message_id,
        "remote_jid": remote_jid, "last_gateway_response": attempt_detail, **LEASE_ENDED, "hold_reason": None,
        **UNKNOWN_CLEARED, **(extra_update or {}),
    }
    status_line = TimelineLine(EventKind.STATUS, {"status": SENT, "evolutionMessageId": evolution_message_id}, now)
    lines = [attempt_line, status_line] if attempt_line else [status_line]
    if not writes.compare_and_set(message.pk, sources("mark_sent", within=tuple(from_statuses)), lease_token, changes, lines):
        if attempt_line is not None:
            # The lease was lost meanwhile, but the attempt did happen: the timeline keeps it.
            message.record(attempt_line.kind, **attempt_line.detail)
        return False
    created_at = message.__dict__.get("created_at")  # loaded by the claim; never a query of its own
    vars(message).update(changes)
    if created_at is not None:
        observe.observe(observe.ACCEPT_TO_SENT, message.lane, (now - created_at).total_seconds())
    message_sent.send(sender=Message, message=message)
    return True


def answer_after_receipts(message: Message, lease_token: uuid.UUID, evolution_message_id: str, remote_jid: str,
                          attempt_detail: dict[str, Any], extra_update: dict[str, Any] | None = None) -> bool:
    """Receipts matched on the message's own id moved it past SENT before its worker recorded sendText's answer: the
    answer joins it (attempt, id, jid, a send time if none), the lease ends, the status stays. The line is the caller's."""
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
    """A receipt's statuses to move from, columns and STATUS line. One that overtakes an earlier one (DELIVERY_ACK
    before SERVER_ACK: the two channels race) implies the earlier steps, whose times are filled while empty. It proves
    the send: a lost answer's marks go, and a message found by its own id (`key_id`) takes it as Evolution's."""
    target = Status(status)
    implied = {STAMPS[earlier]: KeepEarlier(at) for earlier in PROGRESS[1 : PROGRESS.index(target)]}
    changes = {"status": status, "updated_at": at, **implied, STAMPS[target]: at, **UNKNOWN_CLEARED}
    if key_id:
        changes["evolution_message_id"] = FillEmpty(key_id)
    return sources("advance", target), changes, [TimelineLine(EventKind.STATUS, {"status": status, **detail}, at)]


def advance(message: Message, status: str, at: datetime | None = None, key_id: str = "", **detail: Any) -> bool:
    """A receipt moves delivery forward to `status` with its STATUS line, in one statement; a late one does nothing.
    One matched on the message's own id (`key_id`) while its send's answer is not recorded (QUEUED, SENDING: the
    answer was lost, or the receipt overtook it) proves the send: the message is SENT first, with a line of its own."""
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
    """`advance` as CTEs (`changed`, `timeline`) of a larger statement, for the message `message_ref` (an SQL
    expression): ingestion's one statement per receipt. With their parameters and lines."""
    before, changes, lines = _progress(status, at, detail, key_id)
    ctes, params = writes.compare_and_set_ctes(message_ref, [], before, None, changes, lines)
    return ctes, params, lines


def stop_status_sync(message: Message, now: datetime, why: str) -> bool:
    """Status sync stops asking about a message that had no receipt: stamped, one SYNC_STOPPED line, status kept."""
    line = TimelineLine(EventKind.SYNC_STOPPED, {"status": message.status, "why": why}, now)
    return writes.compare_and_set(message.pk, sources("stop_status_sync"), None,
                                  {"status_checked_at": now, "status_sync_stopped_at": now}, [line])


_FLAG_UNACKNOWLEDGED = """
WITH flagged AS (
    UPDATE messaging_message m
       SET unacknowledged_at = %(now)s
      FROM messaging_instance i
     WHERE m.id = ANY(ARRAY(
               SELECT id FROM messaging_message
                WHERE status = %(sent)s AND status_sync_stopped_at IS NULL AND unacknowledged_at IS NULL
                  AND sent_at < %(cutoff)s
                ORDER BY sent_at
                LIMIT %(limit)s))
       AND m.status = %(sent)s AND m.unacknowledged_at IS NULL AND i.id = m.instance_id
    RETURNING m.id, m.sent_at, i.name
)
INSERT INTO messaging_messageevent (message_id, kind, actor, detail, created_at)
SELECT id, %(kind)s, '', jsonb_build_object('status', %(sent)s::text, 'instance', name, 'sentAt', sent_at,
                                            'ackTimeoutSeconds', %(timeout)s::int),
       GREATEST(%(now)s, clock_timestamp())
  FROM flagged
"""


def flag_unacknowledged(now: datetime, timeout_seconds: int, limit: int) -> int:
    """SENT since before `now - timeout_seconds` with no receipt: stamped unacknowledged_at with one UNACKNOWLEDGED
    line each, status kept, at most `limit` (the oldest sends first), in one statement; how many. Each once."""
    with connection.cursor() as cursor:
        cursor.execute(_FLAG_UNACKNOWLEDGED, {
            "now": now, "cutoff": now - timedelta(seconds=timeout_seconds), "limit": limit, "timeout": timeout_seconds,
            "kind": EventKind.UNACKNOWLEDGED, "sent": sources("flag_unacknowledged")[0],
        })
        return int(cursor.rowcount)


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
        DeadLetter.objects.update_or_create(message=message, defaults={
            "project_id": message.project_id, "reason": reason, "detail": detail[:2000], "last_gateway_response": response,
            "attempts": message.attempts, "status": "OPEN", "resolved_by": "", "resolved_at": None})
        message.record(EventKind.DEAD_LETTERED, reason=reason)
    return True


def expire(message: Message, reason: str, detail: str, response: Any = None) -> bool:
    """QUEUED → FAILED when its deadline passed while it waited (`reason` EXPIRED, or OUTCOME_UNKNOWN when its last
    answer was lost): as `fail`, and its outbox entry goes with it."""
    with transaction.atomic():
        if not fail(message, reason, detail, response, from_statuses=sources("expire")):
            return False
        OutboxEntry.objects.filter(message=message).delete()
    return True


def withdraw(message: Message, reason: str, detail: str) -> bool:
    """QUEUED → FAILED before any send because the message may no longer go (`reason` OPTED_OUT: its recipient's
    consent ended; messaging.consent): as `expire`, its outbox entry goes with it. A message whose last answer was
    lost is left alone (it may have been sent: its claim asks Evolution first)."""
    with transaction.atomic():
        # Locked, so that the message cannot be claimed and its answer lost between this look and the update.
        rows = Message.objects.select_for_update(no_key=True).filter(pk=message.pk, status__in=sources("withdraw"))
        if not list(rows.filter(unconfirmed_attempt_at__isnull=True).values_list("pk", flat=True)):
            return False
        if not fail(message, reason, detail, from_statuses=sources("withdraw")):
            return False
        OutboxEntry.objects.filter(message=message).delete()
    return True


def resend(message: Message, now: datetime, corrected: dict[str, Any], actor: str, /, **detail: Any) -> bool:
    """FAILED → QUEUED by a person's force resend: a fresh attempt budget, due now, with `corrected` (its recipient,
    instance and deliverUntil as the funnel judged them), a RESENT line (`detail`) and an outbox entry. Nothing of the failed
    send stays: a REJECTED message was sent once, and its old WhatsApp ids and receipts belong to that send (the next
    claim draws a new id)."""
    fresh = {
        "status": QUEUED, "attempts": 0, "max_attempts": settings.SEND_MAX_ATTEMPTS, "next_attempt_at": now,
        "dispatched_at": None, **LEASE_ENDED, **UNKNOWN_CLEARED, "failure_reason": "", "failure_detail": "", "failed_at": None,
        "last_gateway_response": None, "evolution_message_id": "", "own_message_id": "", "remote_jid": "",
        **dict.fromkeys(STAMPS.values()), "unacknowledged_at": None, "updated_at": now, **corrected,
    }
    with transaction.atomic():
        if not writes.update_if(message.pk, sources("resend"), None, **fresh):
            return False
        message.refresh_from_db()
        message.record(EventKind.RESENT, actor=actor, **detail)
        inserts.enqueue(message, now)
    return True
