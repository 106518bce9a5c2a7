"""The inbox of Evolution events: one row per distinct event, whichever channel saw it first."""

from __future__ import annotations

from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Channel(models.TextChoices):
    WEBHOOK = "WEBHOOK", "Webhook"
    RABBITMQ = "RABBITMQ", "RabbitMQ"


class IngestionEvent(models.Model):
    # SHA-256 of the event's stable identity (inbox.dedup_key): the unique index is the truth
    # for dedup; the Redis lock in front of it is only a fast filter (architecture principle 3). A Meta
    # constraint rather than unique=True: that would add a second (LIKE) index to every insert.
    dedup_key = models.CharField(max_length=64)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    event = models.CharField(max_length=64)
    instance_name = models.CharField(max_length=100, blank=True, default="")
    key_id = models.CharField(max_length=64, blank=True, default="", help_text="WhatsApp message id")
    payload = models.JSONField()
    received_at = models.DateTimeField(default=timezone.now)
    # Evolution's own `date_time` (its local clock, labelled Z): orders state snapshots such as
    # connection.update that may arrive out of order over two channels.
    occurred_at = models.DateTimeField(null=True, blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=40, blank=True, default="")
    forward_attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "evolution_ingestion_events"
        constraints = [
            # The name Postgres gave the column's UNIQUE in 0001: the constraint is the same one.
            models.UniqueConstraint(fields=["dedup_key"], name="evolution_ingestion_events_dedup_key_key"),
        ]
        indexes = [
            # ingestion.reconciler: unprocessed rows older than two minutes, fewest forwards first.
            models.Index(
                fields=["forward_attempts", "received_at"], name="ingest_unprocessed", condition=Q(processed_at__isnull=True)
            ),
            # handlers: receipts that arrived before the send that produced them was committed.
            models.Index(fields=["key_id"], name="ingest_key_id", condition=~Q(key_id="")),
            # retention (ingestion.retention): processed rows by age. BRIN: rows arrive in time
            # order, so a few pages cover the table and an insert costs next to nothing.
            BrinIndex(fields=["received_at"], name="ingest_received_brin"),
            # callbacks.derive_events: the inbound messages in id order, without reading the receipts and
            # send confirmations around them (hundreds per inbound message under load).
            models.Index(fields=["id"], name="ingest_upserts", condition=Q(event="messages.upsert")),
        ]

    def __str__(self) -> str:
        return f"{self.event} {self.instance_name} {self.key_id} ({self.channel})"
