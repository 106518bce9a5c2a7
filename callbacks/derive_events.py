"""Each event type's source for the relay pass (callbacks.derive): the read of the rows past a cursor that owe
it, and the deliveries written from them, one per endpoint subscribed in the event's environment.

Environments (the sandbox rule, docs/security.md): an endpoint receives the events of its own environment
only. A status change is its message's environment's; an inbound message is a TEST event when its sender is
the project's test number (either form of a Brazilian ninth digit), else a LIVE one; a revocation is its
consent's environment's (a recipient's opt-out keyword ends their consent in both, so each gets its own).

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
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any, Callable, Iterable

from django.conf import settings
from django.db import connection
from django.utils import timezone

from messaging.models import STATUS_LINE_KINDS, Environment, Status
from messaging.opt_outs import phone_variants

from .derive_payloads import health_payload, inbound_payload, status_payload, unacknowledged_payload
from .models import Delivery, EventType, WebhookEndpoint

BATCH = 1000
SKEW = timedelta(seconds=60)
# The timeline lines that are a change of status a customer sees (messaging.models.STATUS_LINE_KINDS).
STATUS_KINDS = STATUS_LINE_KINDS


# --- reading past a cursor ---------------------------------------------------------------------


Rows = list[tuple[Any, ...]]


@dataclass
class Read:
    rows: Rows  # the rows that owe deliveries
    ids: list[int]  # every row read (by id; none for the opt-ins' time cursor)
    last: int | None  # how far the read went: the next candidate position
    full: bool  # it stopped at BATCH rows: more may follow at once


def _json(value: Any) -> Any:
    """Django's psycopg connection hands raw SQL's json columns over as text."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _sql_list(values: Iterable[str]) -> str:
    """Constants written into a statement (our own enum values, never input)."""
    return ", ".join("'" + value.replace("'", "''") + "'" for value in values)


def _micros(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000)


def _from_micros(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1_000_000, tz=dt_timezone.utc)


def _rows_by_id(sql: str, after: int, seen: list[int],
                keep: Callable[[list[tuple[Any, ...]]], list[Any]] | None = None) -> Read:
    """One batch of a read whose cursor is the rows' id (`sql` takes after, seen and batch; the id is the row's first
    column): every id read counts as seen, and `keep` chooses the rows that make events."""
    with connection.cursor() as cursor:
        cursor.execute(sql, {"after": after, "seen": seen, "batch": BATCH})
        rows = cursor.fetchall()
    ids = [row[0] for row in rows]
    return Read(keep(rows) if keep else rows, ids, ids[-1] if ids else None, len(ids) == BATCH)


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


# --- writing deliveries ------------------------------------------------------------------------


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


# --- message.status -------------------------------------------------------------------------------

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


def _status_rows(after: int, seen: list[int]) -> Read:
    # A line's message is never missing (the lines go with it, in the same transaction).
    return _rows_by_id(_STATUS_READ, after, seen)


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
