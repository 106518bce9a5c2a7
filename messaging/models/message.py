"""A message and what hangs off it: its timeline (MessageEvent), its outbox entries, its dead letter; the
answers replayed for an Idempotency-Key; and each number's sending schedule (SendSchedule).

A column whose value at accept is nearly always the same has it as its database default too (`db_default`): an
accept's one statement leaves such a column out (messaging.inserts), which keeps that statement within psycopg's
cache of parsed statements.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from ..choices import (
    STATUS_LINE_KINDS,
    Category,
    DeadLetterStatus,
    Environment,
    EventKind,
    FailureReason,
    Priority,
    Status,
    Typing,
)
from ..querysets import DeadLetterQuerySet, MessageQuerySet
from .tenants import ApiKey, Instance, Project


class Message(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: msg_project_created (project_id, environment, created_at) starts with it.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="messages", db_index=False)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL)
    environment = models.CharField(max_length=4, choices=Environment.choices)
    category = models.CharField(max_length=10, choices=Category.choices)
    priority = models.CharField(max_length=6, choices=Priority.choices, default=Priority.NORMAL, db_default=Priority.NORMAL)
    typing = models.CharField(max_length=4, choices=Typing.choices, default=Typing.AUTO, db_default=Typing.AUTO)
    to = models.CharField(max_length=20)
    template = models.TextField()
    variables = models.JSONField(default=dict, blank=True)
    text = models.TextField(help_text="The template with its variables applied")
    metadata = models.JSONField(default=dict, blank=True)
    # The send's `callbackUrl`: this message's message.status callbacks also go there (callbacks app).
    callback_url = models.CharField(max_length=2048, blank=True, default="", db_default="")
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="messages")
    requested_instance = models.CharField(max_length=100, blank=True, default="", db_default="")

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_default=Status.QUEUED)
    failure_reason = models.CharField(
        max_length=20, choices=FailureReason.choices, blank=True, default="", db_default=""
    )
    failure_detail = models.TextField(blank=True, default="", db_default="")
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    max_attempts = models.PositiveIntegerField(default=10)
    deliver_until = models.DateTimeField()
    # The due time of the next release lives here, not in Celery (docs/architecture.md, principle 2).
    next_attempt_at = models.DateTimeField(default=timezone.now)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Set when an attempt's answer was lost (timeout after sending): the next attempt first asks
    # Evolution whether that one went out, so a lost answer never becomes a duplicate message.
    # The lost attempt's window, [unconfirmed_attempt_at, unconfirmed_attempt_until], with clock skew
    # on both sides: only a record stamped inside it can be that attempt's (sending.evidence).
    unconfirmed_attempt_at = models.DateTimeField(null=True, blank=True)
    unconfirmed_attempt_until = models.DateTimeField(null=True, blank=True)
    # Set while Evolution's records cannot tell whether a lost answer's send went out (shown in the
    # API, dashboard and admin); a message never leaves it silently: SENT on evidence, sent again
    # only on evidence that it was not, or FAILED OUTCOME_UNKNOWN.
    outcome_unknown_since = models.DateTimeField(null=True, blank=True)
    # The WhatsApp id Evolution gave the send (its answer's key.id, or the record a check found).
    evolution_message_id = models.CharField(max_length=64, blank=True, default="", db_default="")
    # The WhatsApp id this message's sends carry (Evolution's `messageId`), chosen at its first claim
    # (sending.own_id): every retry of the attempt chain keeps it, a resend draws a new one. A lost answer
    # is looked up by it, and a receipt that overtakes the answer is matched on it at once.
    own_message_id = models.CharField(max_length=64, blank=True, default="", db_default="")
    remote_jid = models.CharField(max_length=80, blank=True, default="", db_default="")
    last_gateway_response = models.JSONField(null=True, blank=True)
    # What holds the message back (why and where) since its last WAITING line: a hold for the same
    # reason writes no new line, and the relay writes no DISPATCHED line for a held message (issue
    # 22: a held MARKETING message wrote two lines per 30 s cycle). NULL, not "", when not held:
    # the accept insert leaves NULL columns out (messaging.inserts._insert).
    hold_reason = models.CharField(max_length=200, null=True, blank=True)
    # Status sync (messaging.status_sync): when it last asked Evolution about this message, and when
    # it gave up (STATUS_SYNC_GIVE_UP_AFTER_HOURS after the send; a SYNC_STOPPED line says so).
    status_checked_at = models.DateTimeField(null=True, blank=True)
    status_sync_stopped_at = models.DateTimeField(null=True, blank=True)
    # When the status sync pass found it SENT for ACK_TIMEOUT_SECONDS with no receipt (messaging.unacknowledged).
    # Kept once a receipt arrives (history); `unacknowledged` is true only while it is still SENT.
    unacknowledged_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    server_ack_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)

    objects = MessageQuerySet.as_manager()

    class Meta:
        indexes = [
            # GET /v1/messages lists a project's messages of the key's environment newest first; the
            # dashboard's overview and charts read one environment's hours.
            models.Index(fields=["project", "environment", "-created_at"], name="msg_project_created"),
            # sending.evidence looks for other messages to the same number whose answer was lost.
            models.Index(
                fields=["instance", "to"],
                name="msg_unconfirmed",
                condition=Q(unconfirmed_attempt_at__isnull=False),
            ),
            # reconciler: QUEUED/SENDING rows (expired leases, lost dispatches, past deliver_until).
            models.Index(
                fields=["status", "deliver_until"],
                name="msg_unfinished",
                condition=Q(status__in=["QUEUED", "SENDING"]),
            ),
            # messaging.consent: an opt-out fails the queued messages to its number. Only QUEUED rows pay for
            # an entry (an accept, a requeue), not the others of a message's life.
            models.Index(fields=["to"], name="msg_queued_to", condition=Q(status="QUEUED")),
            # messaging.unacknowledged: the sends WhatsApp never acknowledged, per instance and by time (the health
            # count, status sync's first candidates, callbacks.derive_events). Only flagged SENT rows pay for an entry.
            models.Index(
                fields=["instance", "sent_at"],
                name="msg_unacknowledged",
                condition=Q(status="SENT", unacknowledged_at__isnull=False),
            ),
            # status_sync: SENT/SERVER_ACK rows it still checks, never checked first, then the least
            # recently checked (its ORDER BY, so a pass reads no more index entries than it takes).
            models.Index(
                F("status_checked_at").asc(nulls_first=True),
                F("sent_at"),
                name="msg_status_sync",
                condition=Q(status__in=["SENT", "SERVER_ACK"], status_sync_stopped_at__isnull=True),
            ),
        ]
        constraints = [
            # One WhatsApp message belongs to one of ours: a lost answer can never be resolved with
            # the id of another message's send (issue 22). Also how ingestion.handlers matches
            # receipts by Evolution's keyId (the index leads with it).
            models.UniqueConstraint(
                fields=["evolution_message_id", "instance"],
                name="msg_evolution_id_once",
                condition=~Q(evolution_message_id=""),
            ),
            # The id we choose is ours alone (72 random bits; the index makes it certain), and receipts
            # find their message by it (ingestion.handlers).
            models.UniqueConstraint(
                fields=["own_message_id"], name="msg_own_id_once", condition=~Q(own_message_id=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.category} → {self.to} [{self.status}]"

    @property
    def outcome_unknown(self) -> bool:
        return self.outcome_unknown_since is not None or self.failure_reason == FailureReason.OUTCOME_UNKNOWN

    @property
    def unacknowledged(self) -> bool:
        """Sent, and WhatsApp never acknowledged it within ACK_TIMEOUT_SECONDS; a later receipt supersedes it."""
        return self.unacknowledged_at is not None and self.status == Status.SENT

    @property
    def lane(self) -> str:
        return self.category.lower()

    def record(self, kind: str, actor: str = "", **detail: Any) -> MessageEvent:
        return MessageEvent.objects.create(message=self, kind=kind, actor=actor, detail=detail)


class MessageEvent(models.Model):
    """One line of a message's timeline."""

    # No index of its own: event_timeline (message_id, created_at) starts with it. Every message
    # writes six or more events, so each index here is paid six times per message (bench B2).
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="events", db_index=False)
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    actor = models.CharField(max_length=150, blank=True, default="", db_default="")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "pk"]
        indexes = [
            models.Index(fields=["message", "created_at"], name="event_timeline"),
            # retention (messaging.retention): old lines by time. BRIN: a few pages, and next to
            # nothing per insert (six or more per message).
            BrinIndex(fields=["created_at"], name="event_created_brin"),
            # callbacks.derive_events: the status lines in id order, without reading the rest of the timeline
            # (a marketing backlog writes its ACCEPTED and DISPATCHED lines first, tens of thousands of
            # them). Partial: only the lines that owe a callback pay for an entry.
            models.Index(fields=["id"], name="event_status_lines", condition=Q(kind__in=STATUS_LINE_KINDS)),
        ]


class OutboxEntry(models.Model):
    """Work that is due (or will be due at `available_at`) for the relay to hand to a lane."""

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="outbox_entries")
    project_id_copy = models.BigIntegerField(help_text="Denormalised for fair release per project")
    lane = models.CharField(max_length=10)
    priority = models.SmallIntegerField(default=0, db_default=0, help_text="Higher is released first")
    available_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # dispatch.release_due: due rows per lane, oldest first.
            models.Index(fields=["lane", "available_at"], name="outbox_due"),
            # dispatch.round_robin_candidates: the skip scan over projects and each project's
            # rows in release order.
            models.Index(fields=["lane", "project_id_copy", "-priority", "available_at", "id"], name="outbox_turns"),
        ]


class DeadLetter(models.Model):
    """A FAILED message waiting for a person: review the reason, then force resend or dismiss."""

    message = models.OneToOneField(Message, on_delete=models.CASCADE, related_name="dead_letter")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="dead_letters")
    reason = models.CharField(max_length=20, choices=FailureReason.choices)
    detail = models.TextField(blank=True, default="")
    last_gateway_response = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=10, choices=DeadLetterStatus.choices, default=DeadLetterStatus.OPEN)
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = DeadLetterQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["project", "status", "-created_at"], name="dlq_project_status")]


class IdempotencyRecord(models.Model):
    """The first answer given for an Idempotency-Key, replayed for 24 h (docs/api.md). The namespace is the
    project's and the key's environment: a TEST send's key never answers a LIVE send."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, db_index=False)  # one_answer_per_key leads with it
    environment = models.CharField(max_length=4, choices=Environment.choices, default=Environment.LIVE)
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "environment", "key"], name="one_answer_per_key")]


class SendSchedule(models.Model):
    """A number's sending schedule under its policy (messaging.sending.slots): its one send in flight (a reservation
    taken by compare-and-set), when it may send next, and what it sent in its current hour and day. Apart from the
    instance's row, so that an admin form saving an instance never writes a stale schedule back."""

    instance = models.OneToOneField(Instance, on_delete=models.CASCADE, primary_key=True, related_name="schedule")
    # The one message that may be sent through this number now, until when (a lost task frees it then).
    reserved_by = models.UUIDField(null=True, blank=True)
    reserved_until = models.DateTimeField(null=True, blank=True)
    next_send_at = models.DateTimeField(null=True, blank=True)
    first_send_at = models.DateTimeField(null=True, blank=True)
    hour_started_at = models.DateTimeField(null=True, blank=True)
    hour_sent = models.PositiveIntegerField(default=0)
    day_started_at = models.DateTimeField(null=True, blank=True)
    day_sent = models.PositiveIntegerField(default=0)
    day_cold = models.PositiveIntegerField(default=0)
    # Its sends to cold contacts in the last 24 policy-hours, oldest first: the quota counts them as WhatsApp does,
    # over a sliding day (at most the quota's worth are kept).
    cold_sent_at = ArrayField(models.DateTimeField(), default=list, blank=True)
