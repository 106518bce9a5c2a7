"""The one way in for a message: check the funnel, then one atomic write (design.md §1).

The write stores the message, its first timeline event, its outbox entry and (when asked) the
idempotent answer, and NOTIFYs the relay. No broker, Redis or HTTP call sits on this path, so
accepting keeps working while they are down.

Accepting is the API's hot path (issue 7, docs/benchmarks.md B1), so it costs two database round
trips: one SELECT reads everything the funnel needs (the stored Idempotency-Key answer, the
opt-in, the candidate instances), and one statement writes every row (data-modifying CTEs; a
single statement is atomic by itself, so no BEGIN/COMMIT either). The decisions between the two
stay plain functions in `rules`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import JSONField, Model
from django.db.models.fields import (
    AutoFieldMixin,
    CharField,
    DateField,
    DateTimeField,
    Field,
    TextField,
    UUIDField,
)
from django.db.models.signals import post_save
from django.utils import timezone

from pilot_status.database import checking_connection

from . import otp_window, remembered, rules, writes
from .errors import Rejected
from .prepared import prepared_cursor
from .models import (
    ApiKey,
    Category,
    EventKind,
    IdempotencyRecord,
    Instance,
    Message,
    MessageEvent,
    OptIn,
    OutboxEntry,
    Priority,
    Project,
    Typing,
)
from .representations import accepted_body

IDEMPOTENCY_TTL = timedelta(hours=24)
OUTBOX_CHANNEL = "outbox"

_ERROR_TEXT = {
    "test_recipient_not_allowed": (403, "TEST keys may only send to the project's test number or a TEST magic number."),
    "production_not_approved": (403, "This project is not approved for production sends yet."),
    "unknown_instance": (422, "That instance does not belong to this project."),
    "own_instance_required": (422, "MARKETING messages must go through one of your own instances."),
    "no_instance_available": (422, "No WhatsApp instance is available for this project."),
    "opt_in_required": (422, "The recipient has no live transactional opt-in for this project."),
}


@dataclass(frozen=True)
class SendRequest:
    to: str
    category: str
    template: str
    variables: dict[str, Any] = field(default_factory=dict)
    instance: str | None = None
    deliver_until: datetime | None = None
    priority: str = Priority.NORMAL
    metadata: dict[str, Any] = field(default_factory=dict)
    typing: str = Typing.AUTO
    callback_url: str = ""


class AnsweredBefore(Exception):
    """This Idempotency-Key already has an answer (stored earlier, or committed by a racing request)."""

    def __init__(self, record: IdempotencyRecord):
        super().__init__(record.key)
        self.record = record


def revoked_key() -> Rejected:
    return Rejected(401, "unauthorized", "Unknown or revoked API key.")


def refuse_if_revoked(api_key: ApiKey | None) -> None:
    """401 for a key revoked since this process cached it (authentication caches keys for a few
    seconds). A valid send learns it from the funnel's read; a refused body asks here, so that the
    key still answers first (contract §3)."""
    if api_key is not None and not ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).exists():
        raise revoked_key()


def reject(code: str, **details: Any) -> Rejected:
    status, text = _ERROR_TEXT[code]
    return Rejected(status, code, text, details)


# ---- the read: everything the funnel needs, in one query ----------------------------------

def _columns(model: type[Model]) -> list[Any]:
    return list(model._meta.concrete_fields)


_INSTANCE_FIELDS = _columns(Instance)
_INSTANCE_COLUMNS = ", ".join(connection.ops.quote_name(f.column) for f in _INSTANCE_FIELDS)
_IDEMPOTENCY_FIELDS = _columns(IdempotencyRecord)


def _best(role: str, where: str) -> str:
    return (
        f"(SELECT '{role}' AS role, {_INSTANCE_COLUMNS} FROM {Instance._meta.db_table}"
        f" WHERE {where} ORDER BY {rules.OPEN_FIRST} LIMIT 1)"
    )


def _facts_sql(named: bool, shared: bool) -> str:
    candidates = [_best("own", "project_id = %(project)s" + (" AND name = %(requested)s" if named else ""))]
    if shared:
        candidates += [_best("official", "project_id IS NULL AND is_official"), _best("shared", "project_id IS NULL")]
    record_columns = ", ".join(f"r.{connection.ops.quote_name(f.column)}" for f in _IDEMPOTENCY_FIELDS)
    # key_active: the API key may have been revoked since this process cached it (authentication
    # caches keys for a few seconds); a send checks it here, in the read it makes anyway.
    return f"""
        SELECT f.opted_in, f.key_active, {record_columns}, c.*
        FROM (SELECT EXISTS (SELECT 1 FROM {OptIn._meta.db_table}
                             WHERE project_id = %(project)s AND phone = %(to)s AND revoked_at IS NULL)
              AS opted_in,
              (%(api_key)s::bigint IS NULL OR EXISTS (SELECT 1 FROM {ApiKey._meta.db_table}
                                                      WHERE id = %(api_key)s::bigint AND revoked_at IS NULL))
              AS key_active) AS f
        LEFT JOIN {IdempotencyRecord._meta.db_table} AS r
               ON r.project_id = %(project)s AND r.key = %(key)s AND r.created_at >= %(cutoff)s
        LEFT JOIN ({" UNION ALL ".join(candidates)}) AS c ON true
    """


# (named instance?, shared candidates needed?) → SQL; built once per process.
_FACTS_SQL = {(named, shared): _facts_sql(named, shared) for named in (False, True) for shared in (False, True)}


@dataclass(frozen=True)
class FunnelFacts:
    opted_in: bool
    candidates: rules.InstanceCandidates
    answer: IdempotencyRecord | None = None
    key_active: bool = True


def _read(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def _read_checking_connection(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The request's first statement, a read that changes nothing, doubles as its connection health
    check (one round trip less than CONN_HEALTH_CHECKS' `SELECT 1`; see pilot_status.database)."""
    return checking_connection(lambda: _read(sql, params))


def read_facts(
    project: Project, req: SendRequest, idempotency_key: str | None, now: datetime, api_key: ApiKey | None = None
) -> FunnelFacts:
    """Whether the API key is still active, the stored answer for the Idempotency-Key, the opt-in and
    the candidate instances: one query."""
    named = bool(req.instance)
    shared = not named and req.category != "MARKETING"
    params: dict[str, Any] = {
        "api_key": api_key.pk if api_key is not None else None,
        "project": project.pk,
        "to": req.to,
        "key": idempotency_key,
        "cutoff": now - IDEMPOTENCY_TTL,
        "requested": req.instance or "",
    }
    rows = _read_checking_connection(_FACTS_SQL[(named, shared)], params)
    width = len(_IDEMPOTENCY_FIELDS)
    first = rows[0]
    answer = None
    if first[2] is not None:
        answer = writes.load(IdempotencyRecord, first[2 : 2 + width])
    found = {
        row[2 + width]: writes.load(Instance, row[3 + width :]) for row in rows if row[2 + width]
    }
    return FunnelFacts(
        opted_in=bool(first[0]),
        candidates=rules.InstanceCandidates(found.get("own"), found.get("official"), found.get("shared")),
        answer=answer,
        key_active=bool(first[1]),
    )


def judge(project: Project, environment: str, req: SendRequest, facts: FunnelFacts) -> Instance:
    """Environment (403), instance (422), opt-in (422), in the contract's order. Returns the instance."""
    code = rules.check_environment(project, environment, req.to)
    if code:
        raise reject(code, to=req.to)
    instance, code = rules.resolve_instance(req.category, req.instance, facts.opted_in, facts.candidates)
    if code or instance is None:
        raise reject(code or "no_instance_available", instance=req.instance)
    code = rules.check_opt_in(req.category, instance, facts.opted_in)
    if code:
        raise reject(code, to=req.to)
    return instance


def check_funnel(project: Project, environment: str, req: SendRequest) -> Instance:
    """The funnel checks after the payload (environment, instance, opt-in). Returns the instance."""
    return judge(project, environment, req, read_facts(project, req, None, timezone.now()))


def find_idempotent_answer(project: Project, key: str, now: datetime | None = None) -> IdempotencyRecord | None:
    cutoff = (now or timezone.now()) - IDEMPOTENCY_TTL
    return IdempotencyRecord.objects.filter(project=project, key=key, created_at__gte=cutoff).first()


# ---- the write: one statement ------------------------------------------------------------

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


# Field classes whose get_db_prep_save() hands a value of exactly this type to the driver as it
# is (to_python returns it unchanged, PostgreSQL's backend adapts nothing; a datetime only when
# aware: a naive one is made aware, with a warning): _row skips those calls, five to seven
# Python calls for each of more than half of an accept's 41 values.
_STORED_AS_GIVEN: dict[type[Field[Any, Any]], type] = {
    CharField: str,
    TextField: str,
    UUIDField: uuid.UUID,
    DateTimeField: datetime,
}


@dataclass(frozen=True)
class _Column:
    field: Any
    name: str  # quoted
    attname: str | None  # set when pre_save() is a plain getattr (no auto_now and the like)
    as_given: type | None  # a value of exactly this type needs no get_db_prep_save()
    # A JSON column's value goes as JSON text cast in SQL, encoded as Django's adapter would:
    # psycopg's JSON dumper is Python code that each new cursor sets up again (bench B1).
    json_encoder: Any = None
    json: bool = False


def _plain_pre_save(f: Any) -> bool:
    """Whether f.pre_save() only reads the attribute: Field's own, or a date(time) column that
    is neither auto_now nor auto_now_add (an accept writes fifteen of those)."""
    if type(f).pre_save is Field.pre_save:
        return True
    return type(f) in (DateField, DateTimeField) and not f.auto_now and not f.auto_now_add


def _insert_columns(model: type[Model]) -> list[_Column]:
    # What Model.save() inserts: every concrete column but a database-generated primary key.
    return [
        _Column(
            field=f,
            name=connection.ops.quote_name(f.column),
            attname=f.attname if _plain_pre_save(f) else None,
            as_given=_STORED_AS_GIVEN.get(type(f)),
            json_encoder=getattr(f, "encoder", None),
            json=isinstance(f, JSONField),
        )
        for f in model._meta.concrete_fields
        if not isinstance(f, AutoFieldMixin)
    ]


_INSERTED: dict[type[Model], list[_Column]] = {
    model: _insert_columns(model) for model in (Message, MessageEvent, OutboxEntry, IdempotencyRecord)
}


def _row(obj: Model, db: Any) -> tuple[str, str, list[Any]]:
    """(table and columns, placeholders, values) of an INSERT of obj, prepared as save() does.

    NULLs are left to the column default (NULL): the statement stays under psycopg's limits for
    caching its parsed form (50 parameters), and a message has ten empty timestamps.
    """
    columns: list[str] = []
    placeholders: list[str] = []
    values: list[Any] = []
    for column in _INSERTED[type(obj)]:
        f = column.field
        value = getattr(obj, column.attname) if column.attname else f.pre_save(obj, True)
        if value is None and f.null:
            continue  # before preparing it: a third of a message's columns are empty
        columns.append(column.name)
        if column.json:
            placeholders.append("%s::jsonb")
            values.append(json.dumps(value, cls=column.json_encoder))
            continue
        placeholders.append("%s")
        if type(value) is column.as_given and (column.as_given is not datetime or value.utcoffset() is not None):
            values.append(value)
        else:
            values.append(f.get_db_prep_save(value, db))
    return f"{obj._meta.db_table} ({', '.join(columns)})", ", ".join(placeholders), values


def _write(
    rows: list[Model], claim: IdempotencyRecord | None, cutoff: datetime, guard: tuple[str, list[Any]] | None = None
) -> bool:
    """Insert rows (and claim the Idempotency-Key first) in one statement, NOTIFY the relay.

    With a claim, every row depends on it: when the key is already held by a live answer (or by
    a racing request, whose commit this statement waits for), nothing is written and this returns
    False. An expired answer for the key is replaced in place (the reconciler purges the rest).
    With a guard (an SQL condition and its parameters), nothing is written unless it holds.
    """
    db = connections[DEFAULT_DB_ALIAS]  # not the proxy: _row asks it for every column
    ctes: list[str] = []
    params: list[Any] = []
    source = ""
    if guard is not None:
        ctes.append(f"guard AS (SELECT 1 WHERE {guard[0]})")
        params += guard[1]
        source = " FROM guard"
    if claim is not None:
        target, placeholders, values = _row(claim, db)
        rows_sql = f"SELECT {placeholders}{source}" if source else f"VALUES ({placeholders})"
        ctes.append(
            f"claim AS (INSERT INTO {target} {rows_sql}"
            " ON CONFLICT (project_id, key) DO UPDATE SET request_hash = EXCLUDED.request_hash,"
            " status_code = EXCLUDED.status_code, response = EXCLUDED.response, created_at = EXCLUDED.created_at"
            f" WHERE {claim._meta.db_table}.created_at < %s RETURNING 1)"
        )
        params += [*values, cutoff]
        source = " FROM claim"
    for i, obj in enumerate(rows):
        target, placeholders, values = _row(obj, db)
        rows_sql = f"SELECT {placeholders}{source}" if source else f"VALUES ({placeholders})"
        returning = " RETURNING lane" if isinstance(obj, OutboxEntry) else ""
        ctes.append(f"w{i} AS (INSERT INTO {target} {rows_sql}{returning})")
        params += values
    outbox = next(i for i, obj in enumerate(rows) if isinstance(obj, OutboxEntry))
    sql = f"WITH {', '.join(ctes)} SELECT pg_notify(%s, w{outbox}.lane) FROM w{outbox}"
    with prepared_cursor() as cursor:
        cursor.execute(sql, [*params, OUTBOX_CHANNEL])
        written = cursor.fetchone() is not None
    if written:
        _sent_signals(rows)
    return written


def _sent_signals(rows: list[Model]) -> None:
    for obj in rows:
        # As save() would: ps:metrics:messages:* are counted from the timeline's post_save.
        post_save.send(sender=type(obj), instance=obj, created=True, update_fields=None, raw=False,
                       using=DEFAULT_DB_ALIAS)


def accept_message(
    project: Project,
    api_key: ApiKey | None,
    environment: str,
    req: SendRequest,
    idempotency_key: str | None = None,
    request_hash: str = "",
) -> dict[str, Any]:
    """Accept a validated send request and return the 202 body.

    Raises AnsweredBefore when the Idempotency-Key already has an answer (the caller replays it,
    or refuses another body with 409), Rejected when a funnel check refuses.
    """
    asked = _Accepting(project, api_key, environment, req, idempotency_key, request_hash, timezone.now())
    if req.category == Category.OTP:
        otp_window.open_window()  # before the write: the background quiets down while this OTP goes
    seen = remembered.candidates_seen(project, req)
    if seen is not None:
        body = _accept_on_seen(asked, seen)
        if body is not None:
            return body
    facts = read_facts(project, req, idempotency_key, asked.now, api_key)
    remembered.remember(project, req, facts)
    if not facts.key_active:  # revoked since this process cached it: the key answers first (contract §3)
        raise revoked_key()
    if facts.answer is not None:
        raise AnsweredBefore(facts.answer)
    rows, claim, body = _rows(asked, judge(project, environment, req, facts))
    if not _write(rows, claim, asked.now - IDEMPOTENCY_TTL):
        # A racing request with the same key committed first: its answer is the answer.
        record = find_idempotent_answer(project, idempotency_key or "", asked.now)
        if record is None:
            raise RuntimeError(f"Idempotency-Key {idempotency_key!r} is held but has no live answer")
        raise AnsweredBefore(record)
    return body


@dataclass(frozen=True)
class _Accepting:
    """One send request on its way in: who asks, what, with which Idempotency-Key, and when."""

    project: Project
    api_key: ApiKey | None
    environment: str
    req: SendRequest
    idempotency_key: str | None
    request_hash: str
    now: datetime


def _rows(asked: _Accepting, instance: Instance) -> tuple[list[Model], IdempotencyRecord | None, dict[str, Any]]:
    """The message, its ACCEPTED line and outbox entry, the Idempotency-Key's answer, and the 202 body."""
    project, api_key, req, now = asked.project, asked.api_key, asked.req, asked.now
    deliver_until = req.deliver_until or rules.deliver_until_for(req.category, now)
    message = Message(
        project=project,
        api_key=api_key,
        environment=asked.environment,
        category=req.category,
        priority=req.priority,
        typing=req.typing,
        to=req.to,
        template=req.template,
        variables=req.variables,
        text=rules.render(req.template, req.variables),
        metadata=req.metadata,
        callback_url=req.callback_url,
        instance=instance,
        requested_instance=req.instance or "",
        deliver_until=deliver_until,
        next_attempt_at=now,
        max_attempts=settings.SEND_MAX_ATTEMPTS,
        created_at=now,
    )
    event = MessageEvent(
        message=message,
        kind=EventKind.ACCEPTED,
        actor=api_key.display_prefix if api_key else "",
        detail={"instance": instance.name},
        # The message's own time, which is also when its outbox entry becomes due: a relay pass
        # that releases it stamps DISPATCHED no earlier, so the timeline never reads DISPATCHED first.
        created_at=now,
    )
    entry = OutboxEntry(
        message=message,
        project_id_copy=project.pk,
        lane=message.lane,
        priority=1 if message.priority == Priority.URGENT else 0,
        available_at=now,
    )
    body = accepted_body(message)
    claim = None
    if asked.idempotency_key:
        claim = IdempotencyRecord(
            project=project, key=asked.idempotency_key, request_hash=asked.request_hash, status_code=202,
            response=body, created_at=now,
        )
    return [message, event, entry], claim, body


def _accept_on_seen(asked: _Accepting, seen: rules.InstanceCandidates) -> dict[str, Any] | None:
    """The 202 body when the guarded one-statement write went through (messaging.remembered), else None."""
    plan = remembered.plan(asked.project, asked.environment, asked.req, seen)
    if plan is None:
        return None
    rows, claim, body = _rows(asked, plan.instance)
    guard = remembered.guard(asked.project, asked.api_key, asked.req, seen, plan)
    return body if _write_checking_connection(rows, claim, asked.now - IDEMPOTENCY_TTL, guard) else None


def _write_checking_connection(
    rows: list[Model], claim: IdempotencyRecord | None, cutoff: datetime, guard: tuple[str, list[Any]]
) -> bool:
    """The guarded write as the request's first statement, doubling as its connection health check
    (pilot_status.database). A write is not run twice blindly: when the connection turns out dead,
    the message's id tells whether the write committed before it broke."""
    first = True

    def attempt() -> bool:
        nonlocal first
        if first:
            first = False
            return _write(rows, claim, cutoff, guard)
        # The connection was replaced: did the dead one commit our statement before it broke?
        if Message.objects.filter(pk=rows[0].pk).exists():
            _sent_signals(rows)
            return True
        return False

    return checking_connection(attempt)
