"""New rows: an accepted message's in one statement, and an outbox entry for the relay.

An accept is the API's hot path (bench B1), so its rows (the message, its first timeline line, its outbox
entry and the Idempotency-Key's answer) are one statement of data-modifying CTEs composed from the INSERTs
Django's insert compiler writes for save() (a single statement is atomic by itself, so no BEGIN/COMMIT
either); tests/messaging/test_accept_rows.py holds it to what save() stores and signals. Which rows a move writes is messaging.lifecycle's; this module only writes them.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Field, Model, Value, sql
from django.db.models.constants import OnConflict
from django.db.models.fields import NOT_PROVIDED, AutoFieldMixin
from django.db.models.signals import post_save
from django.utils import timezone

from .models import IdempotencyRecord, Message, OutboxEntry, Priority
from .prepared import prepared_cursor

OUTBOX_CHANNEL = "outbox"


def enqueue(message: Message, available_at: datetime | None = None) -> OutboxEntry:
    """Add an outbox entry for the relay; call inside the transaction that changed the message."""
    entry = OutboxEntry.objects.create(
        message=message,
        project_id_copy=message.project_id,
        lane=message.lane,
        priority=1 if message.priority == Priority.URGENT else 0,
        available_at=available_at or timezone.now(),
    )
    notify_relay(message.lane)
    return entry


def notify_relay(lane: str) -> None:
    # Delivered at commit, so the relay never wakes up for a row it cannot see yet.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [OUTBOX_CHANNEL, lane])


# ---- new rows in one statement, from Django's insert compiler ------------------------------

# The idempotent answer's claim: an answer older than the cutoff is replaced in place.
_CLAIM_CONFLICT = {
    "on_conflict": OnConflict.UPDATE,
    "unique_fields": [IdempotencyRecord._meta.get_field(name) for name in ("project", "environment", "key")],
    "update_fields": [IdempotencyRecord._meta.get_field(name)
                      for name in ("request_hash", "status_code", "response", "created_at")],
}
_VALUES = re.compile(r" VALUES \(([^()]*)\)")


def _insert(obj: Model, source: str | None, **on_conflict: Any) -> tuple[str, list[Any]]:
    """The INSERT of obj as Django's insert compiler writes it for save() (pre_save(),
    get_db_prep_save(), placeholders), and its parameters. With a source (a CTE's name) the row is
    selected FROM it instead of VALUES: when the source has no row, nothing is inserted.

    A column the database fills with the same value by itself is left out: NULL in a nullable column
    (a message has ten empty timestamps), a column's own default (its status, its empty ids). So the
    whole statement stays under psycopg's limit for caching its parsed form (50 parameters).
    """
    meta = obj._meta
    fields = [f for f in meta.concrete_fields
              if not isinstance(f, AutoFieldMixin) and not _database_fills(f, getattr(obj, f.attname))]
    shape = (type(obj), tuple(f.attname for f in fields), source, _conflict_shape(on_conflict))
    statement = _statements.get(shape)
    if statement is not None and _plain_values(obj, fields):
        # What the compiler does for each value of a row of plain values (SQLInsertCompiler.prepare_value), with
        # the connection itself rather than django.db.connection, a proxy that looks it up on every use.
        db = connections[DEFAULT_DB_ALIAS]
        return statement, [f.get_db_prep_save(f.pre_save(obj, add=True), connection=db) for f in fields]
    query = sql.InsertQuery(type(obj), **on_conflict)
    query.insert_values(fields, [obj])
    [(statement, params)] = query.get_compiler(DEFAULT_DB_ALIAS).as_sql()
    if source is not None:
        statement, replaced = _VALUES.subn(lambda values: f" SELECT {values[1]} FROM {source}", statement, count=1)
        if not replaced:
            raise AssertionError(f"not a one-row INSERT … VALUES: {statement}")
    if _plain_values(obj, fields) and len(_statements) < _MAX_STATEMENTS:
        _statements[shape] = statement
    return statement, list(params)


# A row's INSERT text depends only on its model, its columns and where its values come from, as long as
# every value is a plain one (an expression, or a field with a placeholder of its own, writes SQL of its own):
# Django's compiler writes it once per shape and each row after only prepares its values (bench/findings.md,
# "The accept's insert text, once per shape"). The shapes are the few combinations of optional columns an
# accept has; the bound keeps an odd one from growing the cache.
_statements: dict[tuple[Any, ...], str] = {}
_MAX_STATEMENTS = 256


def _conflict_shape(on_conflict: dict[str, Any]) -> tuple[Any, ...]:
    return tuple((name, tuple(f.name for f in value) if isinstance(value, list) else value)
                 for name, value in sorted(on_conflict.items()))


def _plain_values(obj: Model, fields: list[Field[Any, Any]]) -> bool:
    return not any(hasattr(f, "get_placeholder") or hasattr(getattr(obj, f.attname), "resolve_expression")
                   for f in fields)


def _database_fills(field: Field[Any, Any], value: Any) -> bool:
    """Whether an INSERT that leaves out this column stores value in it."""
    if value is None:
        return field.null
    default = field.db_default  # NOT_PROVIDED, a plain value, or an expression (Value, Now(), …)
    if isinstance(default, Value):
        default = default.value
    return default is not NOT_PROVIDED and not hasattr(default, "resolve_expression") and value == default


def insert_rows(
    rows: list[Model], claim: IdempotencyRecord | None, cutoff: datetime,
    guard: tuple[str, list[Any]] | None = None,
) -> bool:
    """Insert rows (one of them an outbox entry; the Idempotency-Key's claim first), NOTIFY the relay;
    False when the key is held.

    With a claim, every row depends on it: when the key is already held by a live answer (or by
    a racing request, whose commit this waits for), nothing is written and this returns False.
    An expired answer for the key is replaced in place (the reconciler purges the rest).
    With a guard (an SQL condition and its parameters), nothing is written unless it holds.
    """
    ctes: list[str] = []
    params: list[Any] = []
    source = None
    if guard is not None:
        ctes.append(f"guard AS (SELECT 1 WHERE {guard[0]})")
        params += guard[1]
        source = "guard"
    if claim is not None:
        statement, values = _insert(claim, source, **_CLAIM_CONFLICT)
        ctes.append(f"claim AS ({statement} WHERE {claim._meta.db_table}.created_at < %s RETURNING 1)")
        params += [*values, cutoff]
        source = "claim"
    for i, obj in enumerate(rows):
        statement, values = _insert(obj, source)
        returning = " RETURNING lane" if isinstance(obj, OutboxEntry) else ""
        ctes.append(f"w{i} AS ({statement}{returning})")
        params += values
    outbox = next(i for i, obj in enumerate(rows) if isinstance(obj, OutboxEntry))
    with prepared_cursor() as cursor:
        cursor.execute(f"WITH {', '.join(ctes)} SELECT pg_notify(%s, w{outbox}.lane) FROM w{outbox}",
                       [*params, OUTBOX_CHANNEL])
        written = cursor.fetchone() is not None
    if written:
        saved(rows, claim)
    return written


def saved(rows: list[Model], claim: IdempotencyRecord | None) -> None:
    """What save() does after its INSERT, which the one statement did instead: the instances are
    stored, and post_save goes out (ps:metrics:messages:* are counted from the timeline's)."""
    for obj in [claim, *rows] if claim is not None else rows:
        obj._state.adding = False
        obj._state.db = DEFAULT_DB_ALIAS
        post_save.send(sender=type(obj), instance=obj, created=True, update_fields=None, raw=False,
                       using=DEFAULT_DB_ALIAS)

