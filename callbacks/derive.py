"""The relay pass's first half: deliveries written from rows that are already durable.

A status change is committed with its timeline line (messaging.writes.compare_and_set: one
statement), an inbound message with its inbox row, a revocation with its opt-in row. Deliveries are
derived from those rows afterwards, so the hot paths (accept, compare-and-set) write nothing more
than they did (bench B3), and a change that committed has its line: nothing is lost between the two.

Safe to run twice: one delivery per (endpoint, source row) (`one_delivery_per_source`, ON CONFLICT DO
NOTHING), and the cursor only says where reading may start.

Late commits. A timeline id is taken when the row is written, not when it commits, so a reader that
sees id 51 may later see 50 appear. The cursor therefore moves in two steps (`_step`): a read takes
every visible row past `position` and remembers its last id with the snapshot's `xmax` (the first
transaction id not finished when it looked). A later read that starts after every transaction below
that `xmax` has finished (`pg_snapshot_xmin` reached it) sees every row up to that id that will ever
commit, so once it has read them `position` moves there. Until then the same rows are read again, and
the unique key keeps them from counting twice. Opt-in revocations are updates, so their cursor is a
time (`revoked_at`, in microseconds), kept SKEW behind for the clocks of the processes that write it,
with the same two-step rule.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any, Callable, Iterable

from django.db import connection
from django.utils import timezone

from messaging.models import EventKind, Status

from .models import Delivery, EventType, RelayCursor, WebhookEndpoint

BATCH = 1000
_LOCK = 0x63616C6C  # "call": the advisory lock that keeps relay passes one at a time
SKEW = timedelta(seconds=60)
# The timeline lines that are a change of status a customer sees. SENDING is ours (a claim), so it
# has no callback; QUEUED comes back with a force resend.
STATUS_KINDS = (EventKind.STATUS, EventKind.FAILED, EventKind.RESENT)
_PHONE_JID = re.compile(r"^(\d{6,20})@s\.whatsapp\.net$")


@dataclass
class Derived:
    status: int = 0
    inbound: int = 0
    opt_outs: int = 0


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
    if not WebhookEndpoint.objects.filter(enabled=True, per_message=False).exists():
        # Nothing else can be owed, but the cursors still move, so that an endpoint created later
        # starts from its creation and not from the start of the tables.
        _skip_to_end()
        return done
    done.inbound = _by_id("inbox", _inbound_rows, _inbound_deliveries, deadline)
    done.opt_outs = _opt_outs(deadline)
    return done


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


def _step(cursor: RelayCursor, read: Callable[[int], tuple[Rows, int | None]], write: Callable[[Rows], int]) -> int:
    """Read every visible row past `position` and write its deliveries. If every transaction that
    was unfinished when the previous read looked has finished since (checked before this read, so
    all their rows are visible to it), the rows up to that read's last one have all been seen now:
    `position` moves there. This read's last row becomes the next candidate."""
    settled = cursor.pending_xmax is not None and _all_finished_below(cursor.pending_xmax)
    rows, last = read(cursor.position)
    written = write(rows)
    if settled:
        reached = cursor.pending_position if last is None else min(cursor.pending_position, last)
        cursor.position = max(cursor.position, reached)
        cursor.pending_xmax = None
    if last is not None and last > cursor.position:
        cursor.pending_position, cursor.pending_xmax = last, _snapshot_xmax()
    cursor.save(update_fields=_CURSOR_FIELDS)
    return written


def _by_id(
    name: str,
    read: Callable[[int], tuple[Rows, int | None]],
    write: Callable[[Rows], int],
    deadline: float,
) -> int:
    cursor = _cursor(name)
    written = 0
    while True:
        written += _step(cursor, read, write)
        if cursor.pending_xmax is None:
            return written  # everything read is settled
        # Usually the writers that were in flight finish within milliseconds: wait a little for
        # them and go on; else the next pass does.
        for _ in range(5):
            if _all_finished_below(cursor.pending_xmax) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if time.monotonic() > deadline or not _all_finished_below(cursor.pending_xmax):
            return written


def _skip_to_end() -> None:
    """No endpoint is enabled, so nothing is owed: the cursors move to the end of their tables."""
    with connection.cursor() as db:
        db.execute("SELECT coalesce(max(id), 0) FROM evolution_ingestion_events")
        inbox = int(db.fetchone()[0])
    for name, last in (("inbox", inbox), ("opt_ins", _micros(timezone.now() - SKEW))):
        cursor = _cursor(name)
        if last > cursor.position or cursor.pending_xmax is not None:
            cursor.position, cursor.pending_position, cursor.pending_xmax = max(cursor.position, last), 0, None
            cursor.save(update_fields=_CURSOR_FIELDS)


def _json(value: Any) -> Any:
    """Django's psycopg connection hands raw SQL's json columns over as text."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


# --- message.status -------------------------------------------------------------------------------

_STATUS_READ = """
    SELECT e.id, e.kind, m.id, m.project_id, m."to", m.metadata,
           CASE WHEN e.kind = ANY(%(kinds)s) THEN e.detail END, e.created_at, m.callback_url
    FROM messaging_messageevent e JOIN messaging_message m ON m.id = e.message_id
    WHERE e.id > %(after)s
    ORDER BY e.id
    LIMIT %(batch)s
"""


def _status_rows(after: int) -> tuple[list[tuple[Any, ...]], int | None]:
    with connection.cursor() as cursor:
        cursor.execute(_STATUS_READ, {"after": after, "kinds": [str(k) for k in STATUS_KINDS], "batch": BATCH})
        rows = cursor.fetchall()
    last = rows[-1][0] if rows else None
    return [row for row in rows if row[1] in STATUS_KINDS], last


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


def _endpoints_by_project(project_ids: Iterable[int], event_type: str) -> dict[int, list[WebhookEndpoint]]:
    found: dict[int, list[WebhookEndpoint]] = {}
    for endpoint in WebhookEndpoint.objects.filter(
        project_id__in=set(project_ids), enabled=True, per_message=False, event_types__contains=[event_type]
    ).only("id", "project_id"):
        found.setdefault(endpoint.project_id, []).append(endpoint)
    return found


def _insert(deliveries: list[Delivery]) -> int:
    if not deliveries:
        return 0
    # ON CONFLICT (endpoint, source) DO NOTHING: a replayed pass writes nothing twice.
    Delivery.objects.bulk_create(deliveries, ignore_conflicts=True, batch_size=500)
    return len(deliveries)


def per_message_endpoint(project_id: int) -> WebhookEndpoint:
    """The project's endpoint for sends with a callbackUrl (made on first need; one per project)."""
    endpoint, _ = WebhookEndpoint.objects.get_or_create(
        project_id=project_id, per_message=True,
        defaults={"url": "", "event_types": [EventType.MESSAGE_STATUS], "description": "Sends with a callbackUrl"},
    )
    return endpoint


def _status_deliveries(rows: list[tuple[Any, ...]]) -> int:
    endpoints = _endpoints_by_project((row[3] for row in rows), EventType.MESSAGE_STATUS)
    own: dict[int, WebhookEndpoint] = {}
    deliveries = []
    now = timezone.now()
    for event_id, kind, message_id, project_id, to, metadata, detail, at, callback_url in rows:
        payload = status_payload(event_id, kind, message_id, to, _json(metadata), _json(detail) or {}, at)
        for endpoint in endpoints.get(project_id, ()):
            deliveries.append(
                Delivery(
                    endpoint_id=endpoint.pk, event_type=EventType.MESSAGE_STATUS, source=f"event:{event_id}",
                    message_id=message_id, payload=payload, next_attempt_at=now, created_at=now,
                )
            )
        if callback_url:
            endpoint = own.get(project_id) or own.setdefault(project_id, per_message_endpoint(project_id))
            if endpoint.enabled:
                deliveries.append(
                    Delivery(
                        endpoint_id=endpoint.pk, event_type=EventType.MESSAGE_STATUS, source=f"event:{event_id}",
                        url=callback_url, message_id=message_id, payload=payload, next_attempt_at=now, created_at=now,
                    )
                )
    return _insert(deliveries)


# --- message.inbound ------------------------------------------------------------------------------

_INBOUND_READ = """
    SELECT e.id, e.event, i.project_id, e.instance_name, e.key_id,
           CASE WHEN e.event = 'messages.upsert' AND i.project_id IS NOT NULL THEN e.payload END,
           coalesce(e.occurred_at, e.received_at)
    FROM evolution_ingestion_events e LEFT JOIN messaging_instance i ON i.name = e.instance_name
    WHERE e.id > %(after)s
    ORDER BY e.id
    LIMIT %(batch)s
"""


def _inbound_rows(after: int) -> tuple[list[tuple[Any, ...]], int | None]:
    with connection.cursor() as cursor:
        cursor.execute(_INBOUND_READ, {"after": after, "batch": BATCH})
        rows = cursor.fetchall()
    last = rows[-1][0] if rows else None
    inbound = []
    for row in rows:
        payload = _json(row[5])
        if payload is None:
            continue
        data = payload.get("data") if isinstance(payload, dict) else None
        key = data.get("key") if isinstance(data, dict) else None
        if isinstance(key, dict) and key.get("fromMe") is False:
            inbound.append((*row[:5], payload, row[6]))
    return inbound, last


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


def _inbound_deliveries(rows: list[tuple[Any, ...]]) -> int:
    endpoints = _endpoints_by_project((row[2] for row in rows), EventType.MESSAGE_INBOUND)
    deliveries = []
    now = timezone.now()
    for inbox_id, _event, project_id, instance, key_id, payload, at in rows:
        for endpoint in endpoints.get(project_id, ()):
            deliveries.append(
                Delivery(
                    endpoint_id=endpoint.pk, event_type=EventType.MESSAGE_INBOUND, source=f"inbox:{inbox_id}",
                    payload=inbound_payload(instance, key_id, payload["data"], at), next_attempt_at=now, created_at=now,
                )
            )
    return _insert(deliveries)


# --- opt_in.revoked -------------------------------------------------------------------------------


def _micros(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000)


def _from_micros(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1_000_000, tz=dt_timezone.utc)


def _opt_out_rows(after: int) -> tuple[Rows, int | None]:
    since = _from_micros(after) if after else timezone.now() - SKEW
    read_at = timezone.now()
    with connection.cursor() as db:
        db.execute(
            "SELECT id, project_id, phone, revoked_at, revoked_by FROM messaging_optin "
            "WHERE revoked_at IS NOT NULL AND revoked_at >= %s ORDER BY revoked_at LIMIT %s",
            [since, BATCH],
        )
        rows = db.fetchall()
    # The candidate position is SKEW behind our clock (the writers' clocks may lag), and never past
    # the last row of a full read, which may have stopped inside a run of equal times.
    upto = read_at - SKEW
    if len(rows) == BATCH:
        upto = min(upto, rows[-1][3])
    return rows, _micros(upto)


def _opt_out_deliveries(rows: Rows) -> int:
    endpoints = _endpoints_by_project((row[1] for row in rows), EventType.OPT_IN_REVOKED)
    deliveries = []
    now = timezone.now()
    for opt_in_id, project_id, phone, revoked_at, revoked_by in rows:
        for endpoint in endpoints.get(project_id, ()):
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
    return _step(_cursor("opt_ins"), _opt_out_rows, _opt_out_deliveries)
