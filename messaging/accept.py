"""The one way in for a message: check the funnel, then one atomic write (docs/architecture.md, principle 1).

The write (messaging.lifecycle.accept) stores the message, its first timeline event, its outbox entry
and (when asked) the idempotent answer, and NOTIFYs the relay. No broker, Redis or HTTP call sits on
this path, so accepting keeps working while they are down.

Accepting is the API's hot path (issue 7, docs/benchmarks.md B1), so it costs two database round
trips: one SELECT reads everything the funnel needs (messaging.funnel: the stored Idempotency-Key
answer, the opt-in, the candidate instances), and one statement writes every row (messaging.inserts).
Usually the read is skipped too (messaging.remembered).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from pilot_status.database import checking_connection

from . import inserts, lifecycle, remembered, rules
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
from .representations import accepted_body


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
    key still answers first (docs/api.md)."""
    if api_key is not None and not ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).exists():
        raise revoked_key()


def check_funnel(project: Project, environment: str, req: SendRequest) -> Instance:
    """The funnel checks after the payload (environment, instance, opt-in). Returns the instance."""
    return judge(project, environment, req, read_facts(project, environment, req, None, timezone.now()))


def find_idempotent_answer(
    project: Project, environment: str, key: str, now: datetime | None = None
) -> IdempotencyRecord | None:
    """The live answer for an Idempotency-Key in the project's namespace for this environment: a TEST
    send's key never answers (nor conflicts with) a LIVE send."""
    cutoff = (now or timezone.now()) - IDEMPOTENCY_TTL
    return IdempotencyRecord.objects.filter(
        project=project, environment=environment, key=key, created_at__gte=cutoff
    ).first()


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
    seen = remembered.candidates_seen(project, req)
    if seen is not None:
        body = _accept_on_seen(asked, seen)
        if body is not None:
            return body
    facts = read_facts(project, environment, req, idempotency_key, asked.now, api_key)
    remembered.remember(project, environment, req, facts)
    if not facts.key_active:  # revoked since this process cached it: the key answers first (docs/api.md)
        raise revoked_key()
    if facts.answer is not None:
        raise AnsweredBefore(facts.answer)
    rows, claim, body = _rows(asked, judge(project, environment, req, facts))
    if not lifecycle.accept(*rows, claim, asked.now - IDEMPOTENCY_TTL):
        # A racing request with the same key committed first: its answer is the answer.
        record = find_idempotent_answer(project, environment, idempotency_key or "", asked.now)
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


def _rows(
    asked: _Accepting, instance: Instance
) -> tuple[tuple[Message, MessageEvent, OutboxEntry], IdempotencyRecord | None, dict[str, Any]]:
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
            project=project, environment=asked.environment, key=asked.idempotency_key, request_hash=asked.request_hash, status_code=202,
            response=body, created_at=now,
        )
    return (message, event, entry), claim, body


def _accept_on_seen(asked: _Accepting, seen: rules.InstanceCandidates) -> dict[str, Any] | None:
    """The 202 body when the guarded one-statement write went through (messaging.remembered), else None."""
    plan = remembered.plan(asked.project, asked.environment, asked.req, seen)
    if plan is None:
        return None
    rows, claim, body = _rows(asked, plan.instance)
    guard = remembered.guard(asked.project, asked.environment, asked.api_key, asked.req, seen, plan)
    return body if _write_checking_connection(rows, claim, asked.now - IDEMPOTENCY_TTL, guard) else None


def _write_checking_connection(
    rows: tuple[Message, MessageEvent, OutboxEntry], claim: IdempotencyRecord | None, cutoff: datetime,
    guard: tuple[str, list[Any]],
) -> bool:
    """The guarded write as the request's first statement, doubling as its connection health check
    (pilot_status.database). A write is not run twice blindly: when the connection turns out dead,
    the message's id tells whether the write committed before it broke."""
    first = True

    def attempt() -> bool:
        nonlocal first
        if first:
            first = False
            return lifecycle.accept(*rows, claim, cutoff, guard)
        # The connection was replaced: did the dead one commit our statement before it broke?
        if Message.objects.filter(pk=rows[0].pk).exists():
            inserts.saved(list(rows), claim)
            return True
        return False

    return checking_connection(attempt)
