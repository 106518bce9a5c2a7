"""The messaging domain: tenants, keys, instances, messages, their timeline, the outbox, dead letters.

A message's status changes only through messaging.lifecycle: compare-and-set UPDATEs that only move
forward (docs/architecture.md, principle 3), each with its MessageEvent, so that the timeline is the audit trail.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import ExpressionWrapper, F, Q
from django.utils import timezone

# The vocabularies are also imported from here (`X as X`: an explicit re-export).
from .choices import (
    STATUS_LINE_KINDS as STATUS_LINE_KINDS,
    Category as Category,
    ConnectionState as ConnectionState,
    DeadLetterStatus as DeadLetterStatus,
    Environment as Environment,
    EventKind as EventKind,
    FailureReason as FailureReason,
    HealthState as HealthState,
    Priority as Priority,
    SendProfile as SendProfile,
    Status as Status,
    Typing as Typing,
)
from .querysets import DeadLetterQuerySet, MessageQuerySet, ProjectScopedQuerySet
from .tokens import InstanceTokens, hash_secret
# Migration 0007 names the salt's default here, as messaging.models.new_token_salt.
from .tokens import new_token_salt as new_token_salt


# An inbound message whose whole text is one of these (trimmed, case and accents ignored) revokes the
# sender's opt-in for the project (messaging.opt_outs). Portuguese, Spanish and English, as the
# carriers' and Twilio's STOP words, plus their usual Portuguese and Spanish counterparts.
DEFAULT_OPT_OUT_KEYWORDS = [
    "STOP", "STOP ALL", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "OPT OUT", "OPTOUT", "REVOKE",
    "PARAR", "PARE", "SAIR", "CANCELAR", "DESCADASTRAR", "DESCADASTRE", "REMOVER",
    "BAJA", "DAR DE BAJA", "DARSE DE BAJA", "CANCELAR SUSCRIPCION", "ANULAR SUSCRIPCION",
]
MAX_OPT_OUT_KEYWORDS = 50
MAX_OPT_OUT_KEYWORD_LENGTH = 40


def default_opt_out_keywords() -> list[str]:
    return list(DEFAULT_OPT_OUT_KEYWORDS)


class Project(models.Model):
    name = models.CharField(max_length=200)
    production_approved = models.BooleanField(default=False)
    test_number = models.CharField(max_length=20, help_text="E.164 number allowed in TEST")
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="projects")
    opt_out_keywords = ArrayField(
        models.CharField(max_length=MAX_OPT_OUT_KEYWORD_LENGTH),
        size=MAX_OPT_OUT_KEYWORDS,
        default=default_opt_out_keywords,
        blank=True,
        help_text="Comma-separated. An inbound message whose whole text is one of these (case and accents "
        "ignored) revokes the sender's opt-in for this project. Empty: inbound messages never revoke.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"


class ApiKey(models.Model):
    PREFIXES = {Environment.TEST: "ps_test_", Environment.LIVE: "ps_live_"}

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    environment = models.CharField(max_length=4, choices=Environment.choices)
    # Only the hash is stored; `display_prefix` lets people recognise a key in admin.
    key_hash = models.CharField(max_length=64, unique=True)
    display_prefix = models.CharField(max_length=20)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.display_prefix}… ({self.environment})"

    @classmethod
    def issue(cls, project: Project, environment: str) -> tuple[ApiKey, str]:
        """Create a key and return it with its raw value, which is never stored."""
        raw = cls.PREFIXES[Environment(environment)] + secrets.token_urlsafe(24)
        key = cls.objects.create(
            project=project,
            environment=environment,
            key_hash=hash_secret(raw),
            display_prefix=raw[:12],
        )
        return key, raw

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def revoke(self) -> bool:
        return bool(
            ApiKey.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        )


class Instance(InstanceTokens, models.Model):
    """One WhatsApp number connected on Evolution API."""

    name = models.CharField(max_length=100, unique=True, help_text="Evolution instance name")
    project = models.ForeignKey(
        Project,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="instances",
        help_text="Empty: a Pilot Status instance",
    )
    is_official = models.BooleanField(default=False, help_text="The official Pilot Status number")
    priority = models.IntegerField(default=100, help_text="Fallback order: lower goes first")
    connection_state = models.CharField(
        max_length=12, choices=ConnectionState.choices, default=ConnectionState.OPEN
    )
    state_changed_at = models.DateTimeField(default=timezone.now)
    # The webhook token is derived from SECRET_KEY and this salt, so no usable secret sits in
    # the database (issue 8, S5); the Evolution instance token is kept only as a hash. Every
    # instance has its own random salt, however it was made (operators, admin, a script: save()).
    token_salt = models.CharField(max_length=32, default=new_token_salt)
    evolution_token_hash = models.CharField(max_length=64, blank=True, default="")
    send_rate_per_second = models.FloatField(
        null=True, blank=True, help_text="Send pace cap for this number; empty: SEND_RATE_PER_INSTANCE"
    )
    # How the number is paced (messaging.sending.policy, docs/sending-policy.md): a new number is taken for a
    # Baileys one, the kind WhatsApp bans for machine-like sending, until someone says it is a Cloud API number.
    send_profile = models.CharField(
        max_length=12, choices=SendProfile.choices, default=SendProfile.UNOFFICIAL,
        help_text="unofficial: human pace (one send at a time, jittered gaps, caps with warm-up, cold-contact "
        "quota); official: a Cloud API number (Meta's throughput and pair rate)",
    )
    send_policy = models.JSONField(
        default=dict, blank=True,
        help_text='Overrides of the profile\'s values, e.g. {"hourly_max": 60}; empty: the documented defaults',
    )
    # The number's standing, moved by the health governor (messaging.governor) or an operator: `at_risk` cuts its
    # caps, `resting` and `restricted` hold its sends. Every change is an InstanceHealthEvent.
    health_state = models.CharField(max_length=12, choices=HealthState.choices, default=HealthState.HEALTHY)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    # Until then the number writes to no cold contact (a 463 on one started a cooling period).
    cold_paused_until = models.DateTimeField(null=True, blank=True)
    # An operator's health state holds until then; the governor judges the signals again after it.
    health_override_until = models.DateTimeField(null=True, blank=True)
    # Evolution's statusReason of the last connection.update (401 logged out, 403 forbidden: banned).
    connection_reason = models.PositiveSmallIntegerField(null=True, blank=True)
    # A configuration fault Evolution reported for this instance (e.g. 401: our apikey is refused).
    # Kept here so that it is loud in admin, not only in a log line.
    last_gateway_error = models.TextField(blank=True, default="")
    last_gateway_error_at = models.DateTimeField(null=True, blank=True)
    # Whether this Evolution sends with the WhatsApp id we choose (`messageId`): empty until an answer
    # shows it, False when an answer's key.id is not the one asked for (an Evolution older than the
    # field ignores it). A lost answer's "not found by our id" proves "not sent" only when True
    # (sending.evidence).
    honours_message_id = models.BooleanField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["priority", "pk"]
        indexes = [
            # The best instance of a group (rules.OPEN_FIRST): the accept funnel takes the first entry
            # instead of sorting a project's instances for every message.
            models.Index(
                F("project"),
                ExpressionWrapper(~Q(connection_state=ConnectionState.OPEN), output_field=models.BooleanField()),
                F("priority"),
                F("id"),
                name="instance_best",
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=~Q(token_salt=""), name="instance_token_salt_set"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_pilot_status(self) -> bool:
        return self.project_id is None

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.token_salt:
            # Made with an explicit empty salt (a form, a script): never a token anyone can derive.
            self.token_salt = new_token_salt()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from .sending.policy import PolicyError, check_overrides

        try:
            self.send_policy = check_overrides(self.send_profile, self.send_policy or {})
        except PolicyError as exc:
            raise ValidationError({"send_policy": str(exc)}) from exc

    def set_connection_state(self, state: str) -> bool:
        """Record the state Evolution reports; True when it changed."""
        changed = Instance.objects.filter(pk=self.pk).exclude(connection_state=state).update(
            connection_state=state, state_changed_at=timezone.now()
        )
        if changed:
            self.connection_state = state
        return bool(changed)


class OptIn(models.Model):
    """A recipient's transactional consent for one project, in one environment (the sandbox rule,
    docs/security.md: a TEST key records and revokes TEST consents, which only TEST sends rely on).
    Revocation keeps the row (history)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="opt_ins")
    environment = models.CharField(max_length=4, choices=Environment.choices, default=Environment.LIVE)
    phone = models.CharField(max_length=20)
    source = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=40, blank=True, default="")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=40, blank=True, default="")
    # How the consent ended: `api` (DELETE /v1/opt-ins), `inbound_keyword` (the recipient wrote an
    # opt-out keyword: messaging.opt_outs), `admin`; and what showed it (`inbox:<inbox event id>`), so
    # that an opt_in.revoked callback and a person can tell why.
    revoked_source = models.CharField(max_length=40, blank=True, default="")
    revoked_reference = models.CharField(max_length=80, blank=True, default="")

    objects = ProjectScopedQuerySet.as_manager()

    class Meta:
        indexes = [
            # callbacks.derive_events: the revocations in time order, without reading every live consent.
            models.Index(fields=["revoked_at"], name="optin_revoked", condition=Q(revoked_at__isnull=False)),
            # messaging.opt_outs: an opt-out written to a shared instance ends every project's live consent for
            # the number (docs/security.md, "Consent").
            models.Index(fields=["phone"], name="optin_live_phone", condition=Q(revoked_at__isnull=True)),
        ]
        constraints = [
            # One live consent per recipient and environment; rules.check_opt_in queries through it.
            models.UniqueConstraint(
                fields=["project", "environment", "phone"],
                condition=Q(revoked_at__isnull=True),
                name="one_live_opt_in_per_phone",
            )
        ]


class Message(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: msg_project_created (project_id, environment, created_at) starts with it.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="messages", db_index=False)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL)
    environment = models.CharField(max_length=4, choices=Environment.choices)
    category = models.CharField(max_length=10, choices=Category.choices)
    priority = models.CharField(max_length=6, choices=Priority.choices, default=Priority.NORMAL)
    typing = models.CharField(max_length=4, choices=Typing.choices, default=Typing.AUTO)
    to = models.CharField(max_length=20)
    template = models.TextField()
    variables = models.JSONField(default=dict, blank=True)
    text = models.TextField(help_text="The template with its variables applied")
    metadata = models.JSONField(default=dict, blank=True)
    # The send's `callbackUrl`: this message's message.status callbacks also go there (callbacks app).
    callback_url = models.CharField(max_length=2048, blank=True, default="")
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="messages")
    requested_instance = models.CharField(max_length=100, blank=True, default="")

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    failure_reason = models.CharField(max_length=20, choices=FailureReason.choices, blank=True, default="")
    failure_detail = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
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
    evolution_message_id = models.CharField(max_length=64, blank=True, default="")
    # The WhatsApp id this message's sends carry (Evolution's `messageId`), chosen at its first claim
    # (sending.own_id): every retry of the attempt chain keeps it, a resend draws a new one. A lost answer
    # is looked up by it, and a receipt that overtakes the answer is matched on it at once.
    own_message_id = models.CharField(max_length=64, blank=True, default="")
    remote_jid = models.CharField(max_length=80, blank=True, default="")
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
    actor = models.CharField(max_length=150, blank=True, default="")
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
    priority = models.SmallIntegerField(default=0, help_text="Higher is released first")
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


class Contact(models.Model):
    """The last exchange of one number (instance) with one recipient, either way: a recipient it never exchanged a
    message with is a cold contact (its daily quota), and the project's instance that last exchanged with a
    recipient sends to them first (the sticky sender). docs/sending-policy.md."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="contacts", db_index=False)
    phone = models.CharField(max_length=20)
    last_exchange_at = models.DateTimeField()
    last_direction = models.CharField(max_length=8)  # inbound | outbound

    class Meta:
        constraints = [models.UniqueConstraint(fields=["instance", "phone"], name="contact_once")]
        indexes = [models.Index(fields=["phone", "-last_exchange_at"], name="contact_by_phone")]


class SignalKind(models.TextChoices):
    """What the health governor counts for a number (messaging.governor)."""

    COLD_SEND = "cold_send", "a send to a cold contact"
    COLD_ERROR = "cold_error", "an ERROR receipt (463) on a message to a cold contact"
    DISCONNECT = "disconnect", "the connection left open, or a send met Connection Closed"
    LOGOUT = "logout", "the connection closed logged out (401)"
    OPT_OUT = "opt_out", "an opt-out reply to the number"


class InstanceSignal(models.Model):
    """One signal of a number's health, kept for the governor's windows (pruned after the longest of them)."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="+", db_index=False)
    kind = models.CharField(max_length=12, choices=SignalKind.choices)
    at = models.DateTimeField(default=timezone.now)
    # The message it is about (a cold send, an error on one), when there is one.
    message_id = models.UUIDField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["instance", "kind", "at"], name="signal_by_instance"),
            models.Index(fields=["message_id"], name="signal_by_message", condition=Q(message_id__isnull=False)),
            models.Index(fields=["at"], name="signal_by_time"),
        ]


class InstanceHealthEvent(models.Model):
    """A change of a number's health state (or of its cooling period): who or what moved it, why, on what
    evidence. Shown in admin and the dashboard, and the source of the `instance.health` callback."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="health_events", db_index=False)
    from_state = models.CharField(max_length=12, choices=HealthState.choices)
    to_state = models.CharField(max_length=12, choices=HealthState.choices)
    reason = models.CharField(max_length=40)
    evidence = models.JSONField(default=dict, blank=True)
    # "governor", or "operator:<username>" for an override.
    actor = models.CharField(max_length=160)
    cold_paused_until = models.DateTimeField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["instance", "-at"], name="health_event_by_instance")]

    def __str__(self) -> str:
        return f"{self.instance_id}: {self.from_state} → {self.to_state} ({self.reason})"
