"""The one way in for a message: check the funnel, then one transaction (design.md §1).

The transaction writes the message, its first timeline event, its outbox entry and (when asked)
the idempotent answer, then NOTIFYs the relay. No broker, Redis or HTTP call sits on this path, so
accepting keeps working while they are down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from . import rules
from .errors import Rejected
from .models import ApiKey, EventKind, IdempotencyRecord, Message, OutboxEntry, Priority, Project
from .representations import accepted_body

IDEMPOTENCY_TTL = timedelta(hours=24)
OUTBOX_CHANNEL = "outbox"

_ERROR_TEXT = {
    "test_recipient_not_allowed": (403, "TEST keys may only send to the project's test number."),
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


class IdempotencyRaceLost(Exception):
    """Another request with the same Idempotency-Key committed first."""


def reject(code: str, **details: Any) -> Rejected:
    status, text = _ERROR_TEXT[code]
    return Rejected(status, code, text, details)


def check_funnel(project: Project, environment: str, req: SendRequest) -> Any:
    """Environment (403), instance (422), opt-in (422), in the contract's order. Returns the instance."""
    code = rules.check_environment(project, environment, req.to)
    if code:
        raise reject(code, to=req.to)
    opted_in = rules.has_live_opt_in(project, req.to)
    instance, code = rules.resolve_instance(project, req.category, req.instance, opted_in)
    if code or instance is None:
        raise reject(code or "no_instance_available", instance=req.instance)
    code = rules.check_opt_in(req.category, instance, opted_in)
    if code:
        raise reject(code, to=req.to)
    return instance


def find_idempotent_answer(project: Project, key: str) -> IdempotencyRecord | None:
    cutoff = timezone.now() - IDEMPOTENCY_TTL
    return IdempotencyRecord.objects.filter(project=project, key=key, created_at__gte=cutoff).first()


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


def _claim_idempotency_key(project: Project, key: str, request_hash: str, body: dict[str, Any]) -> None:
    cutoff = timezone.now() - IDEMPOTENCY_TTL
    IdempotencyRecord.objects.filter(project=project, key=key, created_at__lt=cutoff).delete()
    # A concurrent insert of the same key blocks here until the other transaction ends; if it
    # committed, nothing is inserted and this request replays the other one's answer.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO messaging_idempotencyrecord
                (project_id, key, request_hash, status_code, response, created_at)
            VALUES (%s, %s, %s, 202, %s::jsonb, now())
            ON CONFLICT (project_id, key) DO NOTHING
            RETURNING id
            """,
            [project.pk, key, request_hash, _json(body)],
        )
        if cursor.fetchone() is None:
            raise IdempotencyRaceLost()


def _json(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


def accept_message(
    project: Project,
    api_key: ApiKey | None,
    environment: str,
    req: SendRequest,
    idempotency_key: str | None = None,
    request_hash: str = "",
) -> dict[str, Any]:
    """Accept a validated send request and return the 202 body. Raises Rejected."""
    instance = check_funnel(project, environment, req)
    now = timezone.now()
    deliver_until = req.deliver_until or rules.deliver_until_for(req.category, now)
    with transaction.atomic():
        message = Message.objects.create(
            project=project,
            api_key=api_key,
            environment=environment,
            category=req.category,
            priority=req.priority,
            to=req.to,
            template=req.template,
            variables=req.variables,
            text=rules.render(req.template, req.variables),
            metadata=req.metadata,
            instance=instance,
            requested_instance=req.instance or "",
            deliver_until=deliver_until,
            next_attempt_at=now,
            max_attempts=settings.SEND_MAX_ATTEMPTS,
            created_at=now,
        )
        message.record(EventKind.ACCEPTED, actor=api_key.display_prefix if api_key else "", instance=instance.name)
        enqueue(message, now)
        body = accepted_body(message)
        if idempotency_key:
            _claim_idempotency_key(project, idempotency_key, request_hash, body)
    return body
