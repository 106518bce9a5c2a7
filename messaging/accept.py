"""The one way in for a message: check the funnel, then one atomic write (design.md §1).

The write stores the message, its first timeline event, its outbox entry and (when asked) the
idempotent answer, and NOTIFYs the relay. No broker, Redis or HTTP call sits on this path, so
accepting keeps working while they are down.

Accepting is the API's hot path (issue 7, docs/benchmarks.md B1), so it costs two database round
trips: one SELECT reads everything the funnel needs (messaging.funnel: the stored Idempotency-Key
answer, the opt-in, the candidate instances), and one statement writes every row: data-modifying
CTEs composed from the INSERTs Django's insert compiler writes for save() (a single statement is
atomic by itself, so no BEGIN/COMMIT either). Usually the read is skipped too (messaging.remembered).
ACCEPT_ONE_STATEMENT=0 writes the same rows the plain way instead: save() inside transaction.atomic().
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, transaction
from django.db.models import Model, sql
from django.db.models.constants import OnConflict
from django.db.models.fields import AutoFieldMixin
from django.db.models.signals import post_save
from django.utils import timezone

from pilot_status.database import checking_connection

from . import remembered, rules
from .errors import Rejected
from .funnel import IDEMPOTENCY_TTL as IDEMPOTENCY_TTL  # messaging.reconciler's, too
from .funnel import judge, read_facts
from .models import (
    ApiKey,
    EventKind,
    IdempotencyRecord,
    Instance,
    Message,
    MessageEvent,
    OutboxEntry,
    Priority,
    Project,
    Typing,
)
from .prepared import prepared_cursor
from .representations import accepted_body

OUTBOX_CHANNEL = "outbox"


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


def check_funnel(project: Project, environment: str, req: SendRequest) -> Instance:
    """The funnel checks after the payload (environment, instance, opt-in). Returns the instance."""
    return judge(project, environment, req, read_facts(project, req, None, timezone.now()))


def find_idempotent_answer(project: Project, key: str, now: datetime | None = None) -> IdempotencyRecord | None:
    cutoff = (now or timezone.now()) - IDEMPOTENCY_TTL
    return IdempotencyRecord.objects.filter(project=project, key=key, created_at__gte=cutoff).first()


# ---- the outbox -----------------------------------------------------------------------------

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


# ---- the write: one statement, from Django's insert compiler (ACCEPT_ONE_STATEMENT) ------

# The idempotent answer's claim: an answer older than the cutoff is replaced in place.
_CLAIM_CONFLICT = {
    "on_conflict": OnConflict.UPDATE,
    "unique_fields": [IdempotencyRecord._meta.get_field(name) for name in ("project", "key")],
    "update_fields": [IdempotencyRecord._meta.get_field(name)
                      for name in ("request_hash", "status_code", "response", "created_at")],
}
_VALUES = re.compile(r" VALUES \(([^()]*)\)")


def _insert(obj: Model, source: str | None, **on_conflict: Any) -> tuple[str, list[Any]]:
    """The INSERT of obj as Django's insert compiler writes it for save() (pre_save(),
    get_db_prep_save(), placeholders), and its parameters. With a source (a CTE's name) the row is
    selected FROM it instead of VALUES: when the source has no row, nothing is inserted.

    Empty nullable columns are left out (their default is NULL): a message has ten empty timestamps,
    and the whole statement stays under psycopg's limit for caching its parsed form (50 parameters).
    """
    meta = obj._meta
    fields = [f for f in meta.concrete_fields
              if not isinstance(f, AutoFieldMixin) and not (f.null and getattr(obj, f.attname) is None)]
    query = sql.InsertQuery(type(obj), **on_conflict)
    query.insert_values(fields, [obj])
    [(statement, params)] = query.get_compiler(DEFAULT_DB_ALIAS).as_sql()
    if source is not None:
        statement, replaced = _VALUES.subn(lambda values: f" SELECT {values[1]} FROM {source}", statement, count=1)
        if not replaced:
            raise AssertionError(f"not a one-row INSERT … VALUES: {statement}")
    return statement, list(params)


def _write(
    rows: list[Model], claim: IdempotencyRecord | None, cutoff: datetime, guard: tuple[str, list[Any]] | None = None
) -> bool:
    """Insert rows (and claim the Idempotency-Key first), NOTIFY the relay; False when the key is held.

    With a claim, every row depends on it: when the key is already held by a live answer (or by
    a racing request, whose commit this waits for), nothing is written and this returns False.
    An expired answer for the key is replaced in place (the reconciler purges the rest).
    With a guard (an SQL condition and its parameters), nothing is written unless it holds.
    ACCEPT_ONE_STATEMENT=0: the same rows through the ORM (_write_through_orm), without a guard.
    """
    if not settings.ACCEPT_ONE_STATEMENT:
        if guard is not None:
            raise ValueError("a guarded write needs ACCEPT_ONE_STATEMENT")
        return _write_through_orm(rows, claim, cutoff)
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
        _saved(rows, claim)
    return written


def _saved(rows: list[Model], claim: IdempotencyRecord | None) -> None:
    """What save() does after its INSERT, which the one statement did instead: the instances are
    stored, and post_save goes out (ps:metrics:messages:* are counted from the timeline's)."""
    for obj in [claim, *rows] if claim is not None else rows:
        obj._state.adding = False
        obj._state.db = DEFAULT_DB_ALIAS
        post_save.send(sender=type(obj), instance=obj, created=True, update_fields=None, raw=False,
                       using=DEFAULT_DB_ALIAS)


class _KeyHeld(Exception):
    """The Idempotency-Key has a live answer: the ORM write rolls back."""


def _write_through_orm(rows: list[Model], claim: IdempotencyRecord | None, cutoff: datetime) -> bool:
    """The plain Django way (ACCEPT_ONE_STATEMENT=0): the same rows by save() in one transaction.

    An expired answer for the key is deleted first; inserting the claim then waits for a racing
    request's commit like the one statement does, and its unique key refuses a live answer."""
    try:
        with transaction.atomic():
            if claim is not None:
                IdempotencyRecord.objects.filter(
                    project_id=claim.project_id, key=claim.key, created_at__lt=cutoff
                ).delete()
                try:
                    claim.save(force_insert=True)
                except IntegrityError as held:
                    raise _KeyHeld from held
            for obj in rows:
                obj.save(force_insert=True)
            notify_relay(next(obj.lane for obj in rows if isinstance(obj, OutboxEntry)))
    except _KeyHeld:
        return False
    return True


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
    remembering = settings.ACCEPT_REMEMBER_ROUTING and settings.ACCEPT_ONE_STATEMENT  # the guard needs the one statement
    seen = remembered.candidates_seen(project, req) if remembering else None
    if seen is not None:
        body = _accept_on_seen(asked, seen)
        if body is not None:
            return body
    facts = read_facts(project, req, idempotency_key, asked.now, api_key)
    if remembering:
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
            _saved(rows, claim)
            return True
        return False

    return checking_connection(attempt)
