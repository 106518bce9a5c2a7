"""How messaging.lifecycle's moves are written in SQL and their rows loaded; which statuses a move may
change is the lifecycle's table, not this module's.

The hot moves are one round trip each, prepared (bench B2, B5): a compare-and-set with its timeline lines
is one statement, an `UPDATE` whose `INSERT`s only happen when it matched, all atomic because Postgres runs
one statement atomically in autocommit; a change that returns its message joined to its instance and
project (a claim) is one `UPDATE … RETURNING`; the relay's release and hold and the unacknowledged flag
are one statement each over many messages. The moves off the hot path use the ORM (`update_if`). New
rows (an accept, an outbox entry) are messaging.inserts'. Only the lifecycle calls what writes here
(tests/messaging/test_lifecycle.py); loading rows, finding a message and counting lines are anyone's.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.utils import timezone

from pilot_status import metrics

from .models import DeadLetter, Instance, Message, MessageEvent, Project
from .prepared import prepared_cursor

M = TypeVar("M", bound=models.Model)


@dataclass(frozen=True)
class KeepEarlier:
    """Set the column only while it is empty (an implied earlier receipt keeps its first time)."""

    value: Any


@dataclass(frozen=True)
class FillEmpty:
    """Set a text column only while it is empty ('')."""

    value: str


@dataclass(frozen=True)
class TimelineLine:
    kind: str
    detail: dict[str, Any]
    created_at: datetime
    actor: str = ""


def _fields(model: type[models.Model]) -> list[Any]:
    return list(model._meta.concrete_fields)


def _select_list(model: type[models.Model], alias: str) -> str:
    return ", ".join(f'{alias}."{field.column}"' for field in _fields(model))


def load(model: type[M], values: Sequence[Any]) -> M:
    """A model instance from raw column values, converted as the ORM would (JSON, …)."""
    attnames, converting = _loading(model)
    converted = list(values)
    db = connections[DEFAULT_DB_ALIAS]  # django.db.connection is a proxy that looks it up on every use
    for position, converters, column in converting:
        value = converted[position]
        for converter in converters:
            value = converter(value, column, db)
        converted[position] = value
    return model.from_db(db.alias, attnames, converted)


@functools.cache
def _loading(model: type[models.Model]) -> tuple[list[str], list[tuple[int, list[Any], Any]]]:
    """A model's column names, and the converters of the few columns that have any (JSON): worked
    out once per process instead of for every row (a send loads three rows, an accept up to four)."""
    fields = _fields(model)
    converting = [
        (position, converters, field.cached_col)
        for position, field in enumerate(fields)
        if (converters := field.get_db_converters(connection))
    ]
    return [field.attname for field in fields], converting


# Two parameters of every write of a message go as text, cast in SQL: psycopg's list and JSON
# dumpers are Python code that a cursor sets up again for each statement, on the receipts' hot path.
_STATUS = re.compile(r"^[A-Z_]+$")


@functools.cache
def _text_array(statuses: tuple[str, ...]) -> str:
    """Statuses as a Postgres array literal; they are enum values, so nothing needs quoting."""
    values = list(statuses)
    assert all(_STATUS.match(value) for value in values), values
    return "{" + ",".join(values) + "}"


_DETAIL_ENCODER = MessageEvent._meta.get_field("detail").encoder  # type: ignore[union-attr]


def _detail_json(detail: Any) -> str:
    return json.dumps(detail, cls=_DETAIL_ENCODER)


_WITH_RELATIONS = """
WITH changed AS ({update})
SELECT {message}, {instance}, {project}{extra}
  FROM changed m
  JOIN messaging_instance i ON i.id = m.instance_id
  JOIN messaging_project p ON p.id = m.project_id
"""


@functools.cache
def _with_relations(update: str, extra: str) -> str:
    return _WITH_RELATIONS.format(update=update, message=_select_list(Message, "m"), instance=_select_list(Instance, "i"),
                                  project=_select_list(Project, "p"), extra=f", {extra}" if extra else "")


def changed_with_relations(update: str, params: dict[str, Any], extra: str = "") -> tuple[Message, Any] | None:
    """Run `update` (an `UPDATE messaging_message … RETURNING *`) and return the message it changed with its
    instance and project loaded, and the value of the SQL expression `extra` on the changed row (alias `m`; None
    without one), in one statement; None when it changed no row."""
    with prepared_cursor() as cursor:
        cursor.execute(_with_relations(update, extra), params)
        row = cursor.fetchone()
    if row is None:
        return None
    n_message, n_instance, n_project = len(_fields(Message)), len(_fields(Instance)), len(_fields(Project))
    message = load(Message, row[:n_message])
    instance = load(Instance, row[n_message : n_message + n_instance])
    project = load(Project, row[n_message + n_instance : n_message + n_instance + n_project])
    Message._meta.get_field("instance").set_cached_value(message, instance)  # type: ignore[union-attr]
    Message._meta.get_field("project").set_cached_value(message, project)  # type: ignore[union-attr]
    return message, (row[-1] if extra else None)


# A message's WhatsApp id: the one Evolution gave its send, or the one it chose itself (its sends carry it, so a
# receipt may name it before the send's answer is recorded). Each test leads a unique partial index.
MATCHES_KEY_ID = ("(m.evolution_message_id = %(key_id)s AND m.evolution_message_id <> ''"
                  " OR m.own_message_id = %(key_id)s AND m.own_message_id <> '')")
_BY_EVOLUTION_ID = """
SELECT {message} FROM messaging_message m JOIN messaging_instance i ON i.id = m.instance_id
 WHERE """ + MATCHES_KEY_ID + """ AND i.name = %(instance)s
 ORDER BY m.id LIMIT 1
"""


def message_by_evolution_id(key_id: str, instance_name: str) -> Message | None:
    """The message Evolution knows as `key_id` on that instance (what a receipt names): by the id of its send,
    or by the id it chose for its sends."""
    with prepared_cursor() as cursor:
        cursor.execute(_BY_EVOLUTION_ID.format(message=_select_list(Message, "m")),
                       {"key_id": key_id, "instance": instance_name})
        row = cursor.fetchone()
    return None if row is None else load(Message, row)


_PLAIN, _KEEP_EARLIER, _FILL_EMPTY = "", "keep_earlier", "fill_empty"


@functools.cache
def _setting(shape: tuple[tuple[str, str], ...]) -> tuple[str, tuple[tuple[Any, bool], ...]]:
    """The SET list of a compare-and-set that changes these fields (name, how), and each value's preparer (the field's
    get_db_prep_save) with whether it leaves a None as it is: worked out once per shape of change (a few per process)
    instead of looking every field up and formatting every assignment on each write."""
    assignments, preparers = [], []
    for name, how in shape:
        field = Message._meta.get_field(name)
        assert isinstance(field, models.Field)
        column = field.column
        if how == _KEEP_EARLIER:
            assignments.append(f'"{column}" = COALESCE("{column}", %s)')
        elif how == _FILL_EMPTY:
            assignments.append(f'"{column}" = COALESCE(NULLIF("{column}", \'\'), %s)')
        else:
            assignments.append(f'"{column}" = %s')
        preparers.append((field.get_db_prep_save, field.get_db_prep_save(None, connection) is None))
    return ", ".join(assignments), tuple(preparers)


@functools.cache
def _ctes(setting: str, message_ref: str, leased: bool, n_lines: int) -> str:
    where = f"id = {message_ref} AND status = ANY(%s::varchar[])"
    if leased:
        where += " AND lease_token = %s"
    ctes = f"changed AS (UPDATE messaging_message SET {setting} WHERE {where} RETURNING id, category)"
    if n_lines:
        rows = ", ".join(["(%s::varchar, %s::varchar, %s::jsonb, %s::timestamptz, %s::int)"] * n_lines)
        ctes += f""",
timeline AS (
    INSERT INTO messaging_messageevent (message_id, kind, actor, detail, created_at)
    SELECT changed.id, e.kind, e.actor, e.detail, GREATEST(e.created_at, clock_timestamp())
      FROM changed, (VALUES {rows}) AS e(kind, actor, detail, created_at, position)
     ORDER BY e.position
    RETURNING 1
)"""
    return ctes


def compare_and_set_ctes(
    message_ref: str,
    ref_params: Sequence[Any],
    from_statuses: Iterable[str],
    lease_token: uuid.UUID | None,
    changes: dict[str, Any],
    lines: Sequence[TimelineLine] = (),
) -> tuple[str, list[Any]]:
    """The CTEs of a compare-and-set, for a statement that may do more: `changed` (the update of
    the message `message_ref`, an SQL expression with `ref_params`, if it is still in
    `from_statuses`; RETURNING id, category) and, with lines, `timeline` (its lines).

    A line is stamped no earlier than the database's clock once the update holds the message's
    row: two receipts racing for one message read their clocks in Python in one order and may
    take the row in the other, and the timeline must list them in the order they were applied."""
    shape, values = [], []
    for name, value in changes.items():
        if isinstance(value, KeepEarlier):
            shape.append((name, _KEEP_EARLIER))
            values.append(value.value)
        elif isinstance(value, FillEmpty):
            shape.append((name, _FILL_EMPTY))
            values.append(value.value)
        else:
            shape.append((name, _PLAIN))
            values.append(value)
    setting, preparers = _setting(tuple(shape))
    db = connections[DEFAULT_DB_ALIAS]  # django.db.connection is a proxy that looks it up on every use
    params = [None if value is None and keeps_none else prepare(value, db)
              for value, (prepare, keeps_none) in zip(values, preparers)]
    params += [*ref_params, _text_array(tuple(from_statuses))]
    if lease_token is not None:
        params.append(lease_token)
    for position, line in enumerate(lines):
        params += [line.kind, line.actor, _detail_json(line.detail), line.created_at, position]
    return _ctes(setting, message_ref, lease_token is not None, len(lines)), params


def compare_and_set(
    message_id: Any,
    from_statuses: Iterable[str],
    lease_token: uuid.UUID | None,
    changes: dict[str, Any],
    lines: Sequence[TimelineLine] = (),
) -> bool:
    """Update the row if it is still in `from_statuses` (and under `lease_token` when given) and
    add its timeline lines, in one statement; False (and nothing written) when it had moved on."""
    ctes, params = compare_and_set_ctes("%s", [message_id], from_statuses, lease_token, changes, lines)
    with prepared_cursor() as cursor:
        cursor.execute(f"WITH {ctes} SELECT category FROM changed", params)
        row = cursor.fetchone()
    if row is None:
        return False
    count_timeline(lines, row[0])
    return True


def update_if(message_id: Any, from_statuses: Iterable[str], under_lease: uuid.UUID | None, /, **fields: Any) -> bool:
    """The ORM's compare-and-set, for the moves off the hot path: update the row if it is still in `from_statuses`
    (and under the lease `under_lease` when given); False when it had moved on."""
    rows = Message.objects.filter(pk=message_id, status__in=list(from_statuses))
    if under_lease is not None:
        rows = rows.filter(lease_token=under_lease)
    fields.setdefault("updated_at", timezone.now())
    return bool(rows.update(**fields))


def count_timeline(lines: Sequence[TimelineLine], category: str) -> None:
    """As a saved MessageEvent would (metrics.count_message_event): the timeline's counters, once
    the change commits."""
    names = [name for line in lines for name in metrics.message_counter_names(line.kind, line.detail, category.lower())]
    if names:
        transaction.on_commit(lambda: _count(names))


def _count(names: list[str]) -> None:
    for name in names:
        metrics.messages(name)


# ---- the statements of the moves that are more than one compare-and-set ---------------------------------------

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


def release_rows(entry_ids: list[int], queued: str, now: datetime, kind: str, detail: dict[str, Any]) -> None:
    """lifecycle.release: the entries leave the outbox, and each of their messages still `queued` is stamped
    dispatched with a `kind` line (`detail`), in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(_RELEASED, {"ids": entry_ids, "now": now, "kind": kind, "queued": queued,
                                   "detail": json.dumps(detail)})


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


def hold_rows(entry_ids: list[int], holds: dict[str, tuple[datetime, str, dict[str, Any]]], queued: str,
              now: datetime, kind: str) -> None:
    """lifecycle.hold: each message {id: (until, hold reason, line detail)} still `queued` is due `until`, its outbox
    entry (among `entry_ids`) too, with a `kind` line when its reason changed, in one statement."""
    ids = list(holds)
    params: dict[str, Any] = {
        "ids": ids, "untils": [holds[i][0] for i in ids], "reasons": [holds[i][1] for i in ids],
        "details": [json.dumps({**holds[i][2], "next_attempt_at": holds[i][0].isoformat()}) for i in ids],
        "entries": entry_ids, "queued": queued, "kind": kind, "now": now,
    }
    with connection.cursor() as cursor:
        cursor.execute(_HELD, params)


_CLAIM = """
UPDATE messaging_message
   SET status = %(to)s, lease_token = %(token)s, lease_expires_at = %(lease_until)s, updated_at = %(now)s,
       own_message_id = CASE WHEN own_message_id = '' THEN %(own_id)s ELSE own_message_id END
 WHERE id = %(id)s AND status = %(from)s AND next_attempt_at <= %(due_by)s
RETURNING *"""


def claim_row(message_id: str, source: str, target: str, token: uuid.UUID, now: datetime, due_by: datetime,
              lease_until: datetime, own_id: str, extra: str) -> tuple[Message, Any] | None:
    """lifecycle.claim: `source` → `target` under the lease `token` if due by `due_by`, the message's own id
    `own_id` unless it has one, returned as changed_with_relations returns it (with `extra`)."""
    return changed_with_relations(
        _CLAIM, {"to": target, "from": source, "token": token, "now": now, "lease_until": lease_until,
                 "id": message_id, "due_by": due_by, "own_id": own_id},
        extra=extra,
    )


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


def flag_unacknowledged_rows(sent: str, now: datetime, timeout_seconds: int, limit: int, kind: str) -> int:
    """lifecycle.flag_unacknowledged: at most `limit` messages `sent` before `now - timeout_seconds` and not yet
    flagged, the oldest sends first, stamped with a `kind` line each, in one statement; how many."""
    with connection.cursor() as cursor:
        cursor.execute(_FLAG_UNACKNOWLEDGED, {
            "now": now, "cutoff": now - timedelta(seconds=timeout_seconds), "limit": limit, "timeout": timeout_seconds,
            "kind": kind, "sent": sent,
        })
        return int(cursor.rowcount)


def lock_unanswered(message_id: Any, from_statuses: Iterable[str]) -> bool:
    """Lock the message (FOR NO KEY UPDATE) if it is in `from_statuses` with no attempt whose answer was lost;
    whether it is."""
    rows = Message.objects.select_for_update(no_key=True).filter(pk=message_id, status__in=list(from_statuses))
    return bool(list(rows.filter(unconfirmed_attempt_at__isnull=True).values_list("pk", flat=True)))


def open_dead_letter(message: Message, reason: str, detail: str, response: Any) -> None:
    """lifecycle.fail's dead letter: opened, or opened again over the one of an earlier failure."""
    DeadLetter.objects.update_or_create(message=message, defaults={
        "project_id": message.project_id, "reason": reason, "detail": detail, "last_gateway_response": response,
        "attempts": message.attempts, "status": "OPEN", "resolved_by": "", "resolved_at": None})


def clear_dispatched(message_id: Any, from_statuses: Iterable[str], dispatched_at: datetime | None) -> bool:
    """lifecycle.redispatch: dispatched_at cleared if the message is still in `from_statuses` and dispatched then."""
    rows = Message.objects.filter(pk=message_id, status__in=list(from_statuses), dispatched_at=dispatched_at)
    return bool(rows.update(dispatched_at=None))
