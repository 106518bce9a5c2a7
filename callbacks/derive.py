"""The relay pass's first half: deliveries written from rows that are already durable.

A status change is committed with its timeline line (messaging.lifecycle's moves; one
statement on the hot path), an inbound message with its inbox row, a revocation with its opt-in row, a send
WhatsApp never acknowledged with its message's `unacknowledged_at` (messaging.unacknowledged), a change of a
number's health with its InstanceHealthEvent (messaging.governor). Deliveries are
derived from those rows afterwards, so the hot paths (accept, compare-and-set) write nothing more
than they did (bench B3), and a change that committed has its line: nothing is lost between the two.

Environments (the sandbox rule, docs/security.md): an endpoint receives the events of its own environment
only. A status change is its message's environment's; an inbound message is a TEST event when its sender is
the project's test number (either form of a Brazilian ninth digit), else a LIVE one; a revocation is its
consent's environment's (a recipient's opt-out keyword ends their consent in both, so each gets its own).

Safe to run twice: one delivery per (endpoint, source row) (`one_delivery_per_source`, ON CONFLICT DO
NOTHING), and the cursor only says where reading may start.

Late commits. A timeline id is taken when the row is written, not when it commits, so a reader that
sees id 51 may later see 50 appear. The cursor therefore moves in two steps (`_step`): a read takes
every visible row past `position` and remembers its last id with the snapshot's `xmax` (the first
transaction id not finished when it looked). A later read that starts after every transaction below
that `xmax` has finished (`pg_snapshot_xmin` reached it) sees every row up to that id that will ever
commit, so once it has read them `position` moves there. Until then the same rows are read again, and
the unique key keeps them from counting twice (within one pass, the rows it has already read are
left out of the next read, which goes on past them instead). Opt-in revocations are updates, so their
cursor is a time (`revoked_at`, in microseconds), kept SKEW behind for the clocks of the processes that
write it, with the same two-step rule.

Only the rows that owe a callback are read, each source through a partial index (the timeline's
`event_status_lines`, the inbox's `ingest_upserts`, the opt-ins' `optin_revoked`): a marketing backlog
writes tens of thousands of ACCEPTED and DISPATCHED lines, and receipts fill the inbox, before the
first status change a customer is owed (bench B3). The cursors therefore stop at the last row that
owes one, not at the end of their tables.

Plans. These statements go through Django's own cursor, which binds parameters client-side and never
prepares (messaging.prepared keeps server-side preparation to the hot path's statements): each is
planned with its values, so no generic plan can pick the wrong index after a TRUNCATE. The kinds and
the event name are written into the statements, not bound, so that the planner can always prove a
partial index's condition, and a line's message is looked up by primary key whatever the statistics
say (tests/callbacks/test_derive_plans.py).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any, Callable, Iterable

from django.conf import settings
from django.db import connection
from django.utils import timezone

from messaging.models import STATUS_LINE_KINDS, Environment, EventKind, Status
from messaging.opt_outs import phone_variants

from .models import Delivery, EventType, RelayCursor, WebhookEndpoint

BATCH = 1000
# How many rows past its position one pass may read while an unfinished transaction holds the position
# back (the ids it skips are sent with each read).
READ_AHEAD = 10 * BATCH
_LOCK = 0x63616C6C  # "call": the advisory lock that keeps relay passes one at a time
SKEW = timedelta(seconds=60)
# The timeline lines that are a change of status a customer sees (messaging.models.STATUS_LINE_KINDS).
STATUS_KINDS = STATUS_LINE_KINDS
_PHONE_JID = re.compile(r"^(\d{6,20})@s\.whatsapp\.net$")


@dataclass
class Derived:
    status: int = 0
    inbound: int = 0
    opt_outs: int = 0
    unacknowledged: int = 0
    health: int = 0


def run(budget_seconds: float = 2.0) -> Derived:
    """One pass over the three sources, within its time budget (the next pass goes on)."""
    done = Derived()
    with connection.cursor() as cursor:
        # One pass at a time (beat ticks every second; a pass may take longer): a second one would
        # only read the same rows again.
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_LOCK])
        if not cursor.fetchone()[0]:
            return done
    try:
        return _run(done, budget_seconds)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_LOCK])


def _run(done: Derived, budget_seconds: float) -> Derived:
    deadline = time.monotonic() + budget_seconds
    # The timeline is always read: a send's callbackUrl needs no endpoint registered beforehand.
    done.status = _by_id("timeline", _status_rows, _status_deliveries, deadline)
    wanted = _wanted_event_types()
    # A source no enabled endpoint asks for owes nothing, but its cursor still moves, so that an
    # endpoint created later starts from its creation and not from the start of the table.
    if EventType.MESSAGE_INBOUND in wanted:
        done.inbound = _by_id("inbox", _inbound_rows, _inbound_deliveries, deadline)
    else:
        _skip_inbox_to_end()
    if EventType.OPT_IN_REVOKED in wanted:
        done.opt_outs = _opt_outs(deadline)
    else:
        _skip_opt_ins_to_end()
    if EventType.MESSAGE_UNACKNOWLEDGED in wanted:
        done.unacknowledged = _unacknowledged()
    else:
        _skip_to("unacknowledged", _micros(timezone.now() - SKEW))
    if EventType.INSTANCE_HEALTH in wanted:
        done.health = _by_id("health", _health_rows, _health_deliveries, deadline)
    else:
        _skip_health_to_end()
    return done


def _wanted_event_types() -> set[str]:
    wanted: set[str] = set()
    for types in WebhookEndpoint.objects.filter(enabled=True, per_message=False).values_list("event_types", flat=True):
        wanted.update(types)
    return wanted


# --- the two-step cursor ------------------------------------------------------------------------


def _snapshot_xmax() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        return int(cursor.fetchone()[0])


def _all_finished_below(xmax: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint >= %s", [xmax])
        return bool(cursor.fetchone()[0])


def _cursor(name: str) -> RelayCursor:
    cursor, _ = RelayCursor.objects.get_or_create(name=name)
    return cursor


Rows = list[tuple[Any, ...]]
_CURSOR_FIELDS = ["position", "pending_position", "pending_xmax", "updated_at"]


@dataclass
class Read:
    rows: Rows  # the rows that owe deliveries
    ids: list[int]  # every row read (by id; none for the opt-ins' time cursor)
    last: int | None  # how far the read went: the next candidate position
    full: bool  # it stopped at BATCH rows: more may follow at once


# A read: the position to read past, and the ids past it that this pass has already read (and written).
Reader = Callable[[int, list[int]], Read]


def _step(cursor: RelayCursor, read: Reader, write: Callable[[Rows], int], seen: set[int]) -> tuple[Read, int]:
    """Read every visible row past `position` (but those in `seen`) and write its deliveries. If every
    transaction that was unfinished when the previous read looked has finished since (checked before
    this read, so all their rows are visible to it), the rows up to that read's last one have all been
    seen now: `position` moves there. This read's last row becomes the next candidate."""
    settled = cursor.pending_xmax is not None and _all_finished_below(cursor.pending_xmax)
    got = read(cursor.position, sorted(i for i in seen if i > cursor.position))
    written = write(got.rows)
    seen.update(got.ids)
    if settled:
        # A read that stopped at BATCH rows covered only up to its last one. Any other covered every
        # visible row (those in `seen` were read and written before), so the candidate is reached
        # whatever it returned.
        reached = cursor.pending_position
        if got.full and got.last is not None:
            reached = min(reached, got.last)
        cursor.position = max(cursor.position, reached)
        cursor.pending_xmax = None
    if got.last is not None and got.last > cursor.position:
        cursor.pending_position, cursor.pending_xmax = got.last, _snapshot_xmax()
    cursor.save(update_fields=_CURSOR_FIELDS)
    return got, written


def _by_id(name: str, read: Reader, write: Callable[[Rows], int], deadline: float) -> int:
    """Steps until everything read is settled, or the budget is spent. A backlog is read batch after
    batch; while a transaction that was in flight holds the position back, a full read goes on past
    it (its rows owe deliveries now), up to READ_AHEAD rows."""
    cursor = _cursor(name)
    seen: set[int] = set()  # the rows this pass has written: read again, they would only be written again
    written = 0
    while True:
        got, count = _step(cursor, read, write, seen)
        written += count
        seen -= {i for i in seen if i <= cursor.position}  # never read again
        if time.monotonic() > deadline:
            return written
        if cursor.pending_xmax is None:
            if got.full:
                continue  # a backlog: the next batch at once
            return written  # everything read is settled
        # Usually the writers that were in flight finish within milliseconds: wait a little for
        # them and go on; else read ahead while there is more, or leave it to the next pass.
        for _ in range(5):
            if _all_finished_below(cursor.pending_xmax) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if time.monotonic() > deadline:
            return written
        if not _all_finished_below(cursor.pending_xmax) and (not got.full or len(seen) >= READ_AHEAD):
            return written


def _skip_to(name: str, last: int) -> None:
    cursor = _cursor(name)
    if last > cursor.position or cursor.pending_xmax is not None:
        cursor.position, cursor.pending_position, cursor.pending_xmax = max(cursor.position, last), 0, None
        cursor.save(update_fields=_CURSOR_FIELDS)


def _skip_inbox_to_end() -> None:
    with connection.cursor() as db:
        db.execute("SELECT coalesce(max(id), 0) FROM evolution_ingestion_events")
        _skip_to("inbox", int(db.fetchone()[0]))


def _skip_opt_ins_to_end() -> None:
    _skip_to("opt_ins", _micros(timezone.now() - SKEW))


def _json(value: Any) -> Any:
    """Django's psycopg connection hands raw SQL's json columns over as text."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


# --- message.status -------------------------------------------------------------------------------

def _sql_list(values: Iterable[str]) -> str:
    """Constants written into a statement (our own enum values, never input)."""
    return ", ".join("'" + value.replace("'", "''") + "'" for value in values)


# The status lines through the partial index event_status_lines: its condition written as the index's
# own, so that the planner proves it. Each line's message is looked up by primary key: the LIMITs keep
# both subqueries from being flattened into a join, which a planner that believed the tables empty
# (statistics taken during a bulk insert) ran as a nested loop scanning the message index for every
# line: a million rows for one batch over 2,000 messages (0.5 s), at that rate about 10 minutes for
# the pass through B3's 50,000-message backlog (tests/callbacks/test_derive_plans.py).
_STATUS_READ = f"""
    SELECT l.id, l.kind, m.id, m.project_id, m."to", m.metadata, l.detail, l.created_at, m.callback_url,
           m.environment
    FROM (
        SELECT e.id, e.kind, e.message_id, e.detail, e.created_at
        FROM messaging_messageevent e
        WHERE e.kind IN ({_sql_list(STATUS_KINDS)}) AND e.id > %(after)s AND e.id <> ALL(%(seen)s::bigint[])
        ORDER BY e.id
        LIMIT %(batch)s
    ) l
    CROSS JOIN LATERAL (
        SELECT m.id, m.project_id, m."to", m.metadata, m.callback_url, m.environment
        FROM messaging_message m
        WHERE m.id = l.message_id
        LIMIT 1
    ) m
    ORDER BY l.id
"""


def _rows_by_id(sql: str, after: int, seen: list[int],
                keep: Callable[[list[tuple[Any, ...]]], list[Any]] | None = None) -> Read:
    """One batch of a read whose cursor is the rows' id (`sql` takes after, seen and batch; the id is the row's first
    column): every id read counts as seen, and `keep` chooses the rows that make events."""
    with connection.cursor() as cursor:
        cursor.execute(sql, {"after": after, "seen": seen, "batch": BATCH})
        rows = cursor.fetchall()
    ids = [row[0] for row in rows]
    return Read(keep(rows) if keep else rows, ids, ids[-1] if ids else None, len(ids) == BATCH)


def _status_rows(after: int, seen: list[int]) -> Read:
    # A line's message is never missing (the lines go with it, in the same transaction).
    return _rows_by_id(_STATUS_READ, after, seen)


def status_payload(event_id: int, kind: str, message_id: Any, to: str, metadata: Any, detail: dict[str, Any], at: datetime) -> dict[str, Any]:
    if kind == EventKind.FAILED:
        status, reason = Status.FAILED.value, str(detail.get("reason") or "")
    elif kind == EventKind.RESENT:
        status, reason = Status.QUEUED.value, ""
    else:
        status, reason = str(detail.get("status") or ""), ""
    return {
        "type": EventType.MESSAGE_STATUS.value,
        "timestamp": at.isoformat(),
        "data": {
            "messageId": str(message_id),
            "status": status,
            "statusAt": at.isoformat(),
            # The timeline line's id: it grows with every change of one message, so a receiver
            # keeps the highest it has seen and drops a stale one that arrives late.
            "sequence": event_id,
            "failureReason": reason or None,
            "to": to,
            "metadata": metadata or {},
        },
    }


Scope = tuple[int, str]  # (project id, environment): whose endpoints an event goes to


def _endpoints_by_scope(project_ids: Iterable[int], event_type: str) -> dict[Scope, list[WebhookEndpoint]]:
    found: dict[Scope, list[WebhookEndpoint]] = {}
    for endpoint in WebhookEndpoint.objects.filter(
        project_id__in=set(project_ids), enabled=True, per_message=False, event_types__contains=[event_type]
    ).only("id", "project_id", "environment"):
        found.setdefault((endpoint.project_id, endpoint.environment), []).append(endpoint)
    return found


def _insert(deliveries: list[Delivery]) -> int:
    if not deliveries:
        return 0
    # ON CONFLICT (endpoint, source) DO NOTHING: a replayed pass writes nothing twice.
    Delivery.objects.bulk_create(deliveries, ignore_conflicts=True, batch_size=500)
    return len(deliveries)


def per_message_endpoint(project_id: int, environment: str) -> WebhookEndpoint:
    """The project's endpoint for sends with a callbackUrl (made on first need; one per project and
    environment)."""
    endpoint, _ = WebhookEndpoint.objects.get_or_create(
        project_id=project_id, environment=environment, per_message=True,
        defaults={"url": "", "event_types": [EventType.MESSAGE_STATUS], "description": "Sends with a callbackUrl"},
    )
    return endpoint


def _status_deliveries(rows: list[tuple[Any, ...]]) -> int:
    endpoints = _endpoints_by_scope((row[3] for row in rows), EventType.MESSAGE_STATUS)
    own: dict[Scope, WebhookEndpoint] = {}
    deliveries = []
    now = timezone.now()
    for event_id, kind, message_id, project_id, to, metadata, detail, at, callback_url, environment in rows:
        payload = status_payload(event_id, kind, message_id, to, _json(metadata), _json(detail) or {}, at)
        scope = (project_id, environment)
        for endpoint in endpoints.get(scope, ()):
            deliveries.append(
                Delivery(
                    endpoint_id=endpoint.pk, event_type=EventType.MESSAGE_STATUS, source=f"event:{event_id}",
                    message_id=message_id, payload=payload, next_attempt_at=now, created_at=now,
                )
            )
        if callback_url:
            endpoint = own.get(scope) or own.setdefault(scope, per_message_endpoint(project_id, environment))
            if endpoint.enabled:
                deliveries.append(
                    Delivery(
                        endpoint_id=endpoint.pk, event_type=EventType.MESSAGE_STATUS, source=f"event:{event_id}",
                        url=callback_url, message_id=message_id, payload=payload, next_attempt_at=now, created_at=now,
                    )
                )
    return _insert(deliveries)


# --- message.inbound ------------------------------------------------------------------------------

# The inbox's messages.upsert rows through the partial index ingest_upserts (its condition written as
# the index's own): receipts and send confirmations, hundreds per inbound message, are never read.
INBOUND_EVENT = "messages.upsert"
_INBOUND_READ = f"""
    SELECT e.id, e.event, i.project_id, e.instance_name, e.key_id,
           CASE WHEN i.project_id IS NOT NULL THEN e.payload END,
           coalesce(e.occurred_at, e.received_at), p.test_number
    FROM evolution_ingestion_events e LEFT JOIN messaging_instance i ON i.name = e.instance_name
         LEFT JOIN messaging_project p ON p.id = i.project_id
    WHERE e.event = {_sql_list([INBOUND_EVENT])} AND e.id > %(after)s AND e.id <> ALL(%(seen)s::bigint[])
    ORDER BY e.id
    LIMIT %(batch)s
"""


def _inbound_rows(after: int, seen: list[int]) -> Read:
    return _rows_by_id(_INBOUND_READ, after, seen, _inbound_texts)


def _inbound_texts(rows: list[tuple[Any, ...]]) -> list[Any]:
    """The rows of texts a contact wrote (not our own sends' echoes), each with its payload parsed."""
    inbound = []
    for row in rows:
        payload = _json(row[5])
        if payload is None:
            continue
        data = payload.get("data") if isinstance(payload, dict) else None
        key = data.get("key") if isinstance(data, dict) else None
        if isinstance(key, dict) and key.get("fromMe") is False:
            inbound.append((*row[:5], payload, row[6], row[7]))
    return inbound


def inbound_payload(instance: str, key_id: str, data: dict[str, Any], at: datetime) -> dict[str, Any]:
    key = data.get("key") or {}
    jid = str(key.get("remoteJid") or "")
    phone = _PHONE_JID.match(jid)
    found = data.get("message")
    message: dict[str, Any] = found if isinstance(found, dict) else {}
    text = message.get("conversation") or (message.get("extendedTextMessage") or {}).get("text") or ""
    return {
        "type": EventType.MESSAGE_INBOUND.value,
        "timestamp": at.isoformat(),
        "data": {
            "instance": instance,
            "from": f"+{phone.group(1)}" if phone else None,
            "remoteJid": jid,
            "pushName": data.get("pushName") if isinstance(data.get("pushName"), str) else None,
            "text": str(text)[:4096],
            "whatsappMessageId": key_id,
            "receivedAt": at.isoformat(),
        },
    }


def inbound_environment(sender: str | None, test_number: str) -> str:
    """An inbound message is the TEST world's when it comes from the project's test number (the developer's
    own phone, which TEST sends go to), else the LIVE world's."""
    if sender and test_number and test_number in phone_variants(sender):
        return Environment.TEST
    return Environment.LIVE


def _inbound_deliveries(rows: list[tuple[Any, ...]]) -> int:
    endpoints = _endpoints_by_scope((row[2] for row in rows), EventType.MESSAGE_INBOUND)
    deliveries = []
    now = timezone.now()
    for inbox_id, _event, project_id, instance, key_id, payload, at, test_number in rows:
        body = inbound_payload(instance, key_id, payload["data"], at)
        scope = (project_id, inbound_environment(body["data"]["from"], test_number))
        for endpoint in endpoints.get(scope, ()):
            deliveries.append(
                Delivery(
                    endpoint_id=endpoint.pk, event_type=EventType.MESSAGE_INBOUND, source=f"inbox:{inbox_id}",
                    payload=body, next_attempt_at=now, created_at=now,
                )
            )
    return _insert(deliveries)


# --- opt_in.revoked -------------------------------------------------------------------------------


def _micros(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000)


def _from_micros(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1_000_000, tz=dt_timezone.utc)


# Through the partial index optin_revoked: the live consents are never read. The upper bound changes
# no answer (a time past our clock is read by the next pass, which starts before it) but tells a planner
# without statistics (a TRUNCATE, then a bulk insert) that the range is narrow: with `>=` alone it
# guessed a third of the table and read all of it.
_OPT_OUT_READ = """
    SELECT id, project_id, phone, revoked_at, revoked_by, environment FROM messaging_optin
    WHERE revoked_at IS NOT NULL AND revoked_at >= %(since)s AND revoked_at <= %(until)s
    ORDER BY revoked_at
    LIMIT %(batch)s
"""


def _rows_by_time(sql: str, after: int, time_column: int) -> Read:
    """One batch of a read whose cursor is a time (`sql` takes since, until and batch; `time_column` is the
    row's time, the order of the read)."""
    since = _from_micros(after) if after else timezone.now() - SKEW
    read_at = timezone.now()
    with connection.cursor() as db:
        db.execute(sql, {"since": since, "until": read_at, "batch": BATCH})
        rows = db.fetchall()
    # The candidate position is SKEW behind our clock (the writers' clocks may lag), and never past
    # the last row of a full read, which may have stopped inside a run of equal times.
    upto = read_at - SKEW
    if len(rows) == BATCH:
        upto = min(upto, rows[-1][time_column])
    return Read(rows, [], _micros(upto), len(rows) == BATCH)


def _opt_out_rows(after: int, seen: list[int]) -> Read:
    return _rows_by_time(_OPT_OUT_READ, after, time_column=3)


def _opt_out_deliveries(rows: Rows) -> int:
    endpoints = _endpoints_by_scope((row[1] for row in rows), EventType.OPT_IN_REVOKED)
    deliveries = []
    now = timezone.now()
    for opt_in_id, project_id, phone, revoked_at, revoked_by, environment in rows:
        for endpoint in endpoints.get((project_id, environment), ()):
            deliveries.append(
                Delivery(
                    endpoint_id=endpoint.pk, event_type=EventType.OPT_IN_REVOKED, source=f"optin:{opt_in_id}",
                    payload={
                        "type": EventType.OPT_IN_REVOKED.value,
                        "timestamp": revoked_at.isoformat(),
                        "data": {"phone": phone, "revokedAt": revoked_at.isoformat(), "revokedBy": revoked_by or None},
                    },
                    next_attempt_at=now, created_at=now,
                )
            )
    return _insert(deliveries)


def _opt_outs(deadline: float) -> int:
    # Revocations are rare: one step per pass (the window SKEW behind is read again each time).
    return _step(_cursor("opt_ins"), _opt_out_rows, _opt_out_deliveries, set())[1]


# --- message.unacknowledged -----------------------------------------------------------------------

# A flag is an update of the message (messaging.unacknowledged), so its cursor is a time, as the opt-ins' is
# (`unacknowledged_at`, SKEW behind). Through the partial index msg_unacknowledged (its condition written as the
# index's own): a message a receipt reached before this read has left it, and its flag owes nothing any more.
_UNACKNOWLEDGED_READ = f"""
    SELECT m.id, m.project_id, m.environment, m."to", m.metadata, m.sent_at, m.unacknowledged_at, i.name
    FROM messaging_message m JOIN messaging_instance i ON i.id = m.instance_id
    WHERE m.status = {_sql_list([Status.SENT])} AND m.unacknowledged_at IS NOT NULL
      AND m.unacknowledged_at >= %(since)s AND m.unacknowledged_at <= %(until)s
    ORDER BY m.unacknowledged_at
    LIMIT %(batch)s
"""


def _unacknowledged_rows(after: int, seen: list[int]) -> Read:
    return _rows_by_time(_UNACKNOWLEDGED_READ, after, time_column=6)


def unacknowledged_payload(message_id: Any, to: str, metadata: Any, sent_at: datetime, at: datetime,
                           instance: str, timeout_seconds: int) -> dict[str, Any]:
    return {
        "type": EventType.MESSAGE_UNACKNOWLEDGED.value,
        "timestamp": at.isoformat(),
        "data": {
            "messageId": str(message_id),
            "status": Status.SENT.value,
            "sentAt": sent_at.isoformat(),
            "unacknowledgedAt": at.isoformat(),
            "ackTimeoutSeconds": timeout_seconds,
            "instance": instance,
            "to": to,
            "metadata": metadata or {},
        },
    }


def _unacknowledged_deliveries(rows: Rows) -> int:
    endpoints = _endpoints_by_scope((row[1] for row in rows), EventType.MESSAGE_UNACKNOWLEDGED)
    deliveries = []
    now = timezone.now()
    for message_id, project_id, environment, to, metadata, sent_at, at, instance in rows:
        payload = unacknowledged_payload(message_id, to, _json(metadata), sent_at, at, instance,
                                         settings.ACK_TIMEOUT_SECONDS)
        for endpoint in endpoints.get((project_id, environment), ()):
            deliveries.append(
                Delivery(
                    endpoint_id=endpoint.pk, event_type=EventType.MESSAGE_UNACKNOWLEDGED,
                    source=f"unacknowledged:{message_id}", message_id=message_id, payload=payload,
                    next_attempt_at=now, created_at=now,
                )
            )
    return _insert(deliveries)


def _unacknowledged() -> int:
    # Rare, as revocations are: one step per pass.
    return _step(_cursor("unacknowledged"), _unacknowledged_rows, _unacknowledged_deliveries, set())[1]


# --- instance.health ------------------------------------------------------------------------------

# Each change of a number's health is one InstanceHealthEvent row, written once (messaging.governor): read by id
# with the two-step cursor, as the timeline is. A change goes to the LIVE endpoints of the instance's own project:
# instances are a LIVE matter (the API's /v1/instances answers LIVE keys only), and a shared Pilot Status number
# belongs to no project (its health is for operators: admin, the metric).
_HEALTH_READ = """
    SELECT h.id, i.project_id, i.name, h.from_state, h.to_state, h.reason, h.evidence, h.actor, h.cold_paused_until,
           h.at
    FROM messaging_instancehealthevent h JOIN messaging_instance i ON i.id = h.instance_id
    WHERE h.id > %(after)s AND h.id <> ALL(%(seen)s::bigint[])
    ORDER BY h.id
    LIMIT %(batch)s
"""


def _health_rows(after: int, seen: list[int]) -> Read:
    return _rows_by_id(_HEALTH_READ, after, seen, lambda rows: [row for row in rows if row[1] is not None])


def health_payload(change_id: int, instance: str, from_state: str, to_state: str, reason: str, evidence: Any,
                   actor: str, cold_paused_until: datetime | None, at: datetime) -> dict[str, Any]:
    return {
        "type": EventType.INSTANCE_HEALTH.value,
        "timestamp": at.isoformat(),
        "data": {
            "instance": instance,
            "state": to_state,
            "previousState": from_state,
            "reason": reason,
            "evidence": evidence or {},
            # Who moved it: the governor, or an operator (whose name stays in admin).
            "by": "operator" if actor.startswith("operator:") else "governor",
            "coldContactsPausedUntil": cold_paused_until.isoformat() if cold_paused_until else None,
            "changedAt": at.isoformat(),
            # Grows with each change: keep the highest, drop a lower one that arrives late.
            "sequence": change_id,
        },
    }


def _health_deliveries(rows: Rows) -> int:
    endpoints = _endpoints_by_scope((row[1] for row in rows), EventType.INSTANCE_HEALTH)
    deliveries = []
    now = timezone.now()
    for change_id, project_id, instance, from_state, to_state, reason, evidence, actor, paused, at in rows:
        payload = health_payload(change_id, instance, from_state, to_state, reason, _json(evidence), actor, paused, at)
        for endpoint in endpoints.get((project_id, Environment.LIVE), ()):
            deliveries.append(
                Delivery(
                    endpoint_id=endpoint.pk, event_type=EventType.INSTANCE_HEALTH, source=f"health:{change_id}",
                    payload=payload, next_attempt_at=now, created_at=now,
                )
            )
    return _insert(deliveries)


def _skip_health_to_end() -> None:
    with connection.cursor() as db:
        db.execute("SELECT coalesce(max(id), 0) FROM messaging_instancehealthevent")
        _skip_to("health", int(db.fetchone()[0]))
