"""A project's webhook endpoints, the deliveries owed to them and every attempt (issue 23).

Deliveries are rows, not Celery state: a delivery's next try is its `next_attempt_at`, as a
message's is (docs/architecture.md, principle 2). The relay pass (callbacks.derive) writes them from rows that are
already durable (the timeline, the inbox, the opt-ins); one per (endpoint, source), so a pass that
runs twice writes nothing twice.
"""

from __future__ import annotations

import base64
import secrets
import uuid

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import Q
from django.utils import timezone

from messaging.models import Environment, Project

from . import secret_storage


class EventType(models.TextChoices):
    MESSAGE_STATUS = "message.status", "A message's status changed"
    MESSAGE_INBOUND = "message.inbound", "A message arrived on one of the project's instances"
    OPT_IN_REVOKED = "opt_in.revoked", "A recipient's opt-in was revoked"
    MESSAGE_UNACKNOWLEDGED = "message.unacknowledged", "A message was sent and WhatsApp never acknowledged it"
    INSTANCE_HEALTH = "instance.health", "The health state of one of the project's instances changed"


# The event types as the API's schema lists them (one enum, WebhookEventTypeEnum, wherever a field carries one).
EVENT_TYPES: list[str] = list(EventType.values)


class Circuit(models.TextChoices):
    CLOSED = "closed", "Closed"
    OPEN = "open", "Open"
    HALF_OPEN = "half_open", "Half-open (one probe)"


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and 24 random bytes in base64 (Svix's size)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def new_encrypted_secret() -> str:
    """A new secret as the database keeps it: encrypted (callbacks.secret_storage)."""
    return secret_storage.encrypt(new_secret())


def new_webhook_id() -> str:
    return "msg_" + uuid.uuid4().hex


class WebhookEndpoint(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhook_endpoints")
    # The environment of the key that made it: it receives that environment's events only, and only that
    # environment's keys and dashboard mode see it (the sandbox rule, docs/security.md).
    environment = models.CharField(max_length=4, choices=Environment.choices, default=Environment.LIVE)
    url = models.CharField(max_length=2048)
    description = models.CharField(max_length=200, blank=True, default="")
    event_types = ArrayField(models.CharField(max_length=32, choices=EventType.choices))
    # The `whsec_` signing secret, encrypted under a key kept outside the database (callbacks.secret_storage);
    # read and set it through `secret`.
    encrypted_secret = models.TextField(default=new_encrypted_secret)
    # The project's one endpoint for sends that carry a `callbackUrl`: no URL of its own (each delivery
    # has its message's), its secret signs them, its circuit and failing run cover them all.
    per_message = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    disabled_at = models.DateTimeField(null=True, blank=True)
    # The circuit (callbacks.circuit): state in Postgres, since a delivery's row is read anyway.
    circuit_state = models.CharField(max_length=10, choices=Circuit.choices, default=Circuit.CLOSED)
    circuit_failures = models.PositiveIntegerField(default=0, help_text="Failed attempts in a row")
    circuit_retry_at = models.DateTimeField(null=True, blank=True, help_text="Open: when one probe may go")
    # The first failure of the current failing run; any success clears it. Disabled when it is older
    # than CALLBACKS_DISABLE_AFTER_SECONDS.
    failing_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["project", "environment", "created_at"], name="endpoint_by_project")]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "environment"], condition=Q(per_message=True), name="one_per_message_endpoint"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.url} ({self.project_id})"

    @property
    def secret(self) -> str:
        return secret_storage.decrypt(self.encrypted_secret)

    @secret.setter
    def secret(self, value: str) -> None:
        self.encrypted_secret = secret_storage.encrypt(value)


class DeliveryStatus(models.TextChoices):
    PENDING = "PENDING", "Pending"
    SUCCEEDED = "SUCCEEDED", "Delivered"
    FAILED = "FAILED", "Failed (retries exhausted)"


class Delivery(models.Model):
    """One event owed to one endpoint. Same `webhook_id` on every attempt and replay, so a receiver
    can drop a copy it has seen (Standard Webhooks `webhook-id`)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_type = models.CharField(max_length=32, choices=EventType.choices)
    # Where it came from: `event:<timeline id>`, `inbox:<inbox id>`, `optin:<id>:<revoked epoch µs>`.
    source = models.CharField(max_length=64)
    webhook_id = models.CharField(max_length=40, unique=True, default=new_webhook_id)
    url = models.CharField(max_length=2048, blank=True, default="", help_text="A send's callbackUrl; blank: the endpoint's")
    message_id = models.UUIDField(null=True, blank=True)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # Set by the relay when it hands the delivery to Celery and by the task that claims it: a
    # duplicate task finds another token and does nothing.
    claim_token = models.UUIDField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["endpoint", "source"], name="one_delivery_per_source")]
        indexes = [
            # the relay's release: due pending deliveries only
            models.Index(fields=["next_attempt_at"], name="delivery_due", condition=Q(status="PENDING")),
            models.Index(fields=["endpoint", "created_at"], name="delivery_by_endpoint"),
            # retention (callbacks.retention): old deliveries by time, next to nothing per insert
            BrinIndex(fields=["created_at"], name="delivery_created_brin"),
        ]


class DeliveryAttempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    attempted_at = models.DateTimeField(default=timezone.now)
    url = models.CharField(max_length=2048)
    address = models.CharField(max_length=64, blank=True, default="", help_text="The checked address connected to")
    request_headers = models.JSONField(default=dict)
    response_status = models.IntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True, default="", help_text="The first CALLBACKS_RESPONSE_BODY_BYTES")
    duration_ms = models.IntegerField(default=0)
    error = models.CharField(max_length=300, blank=True, default="")
    succeeded = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["delivery", "attempted_at"], name="attempt_by_delivery")]


class RelayCursor(models.Model):
    """How far the relay pass has read a source table by id (callbacks.derive)."""

    name = models.CharField(max_length=40, primary_key=True)
    position = models.BigIntegerField(default=0, help_text="Every row up to here has been read")
    # The highest row a pass read, and the snapshot's xmax then: `position` moves there once every
    # transaction below that xmax has finished (callbacks.derive says why).
    pending_position = models.BigIntegerField(default=0)
    pending_xmax = models.BigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
