"""A bulk resend: a person's selection of dead letters, resent in the background in chunks.

The row is the job's whole state (what to resend, how far it got, what happened), so the task
that works on it can die and be run again without resending anything twice or losing count.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from messaging.models import Environment


class BulkStatus(models.TextChoices):
    PENDING = "PENDING", "Waiting for a worker"
    RUNNING = "RUNNING", "Running"
    DONE = "DONE", "Done"


class BulkResendJob(models.Model):
    project = models.ForeignKey("messaging.Project", on_delete=models.CASCADE, related_name="bulk_resend_jobs")
    # The dashboard mode it was started in: it resends that environment's dead letters only, and its page
    # is shown in that mode only.
    environment = models.CharField(max_length=4, choices=Environment.choices, default=Environment.LIVE)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    actor = models.CharField(max_length=150, help_text="Recorded on every resent message's timeline")
    # Either the ids a person ticked, or the filter they were looking at (messaging.resend.matching).
    dead_letter_ids = models.JSONField(null=True, blank=True)
    filters = models.JSONField(default=dict, blank=True)
    # Entries that fail after the job was started are not part of it: the person never saw them.
    max_dead_letter_id = models.BigIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    # Progress: dead letters are taken in id order; `cursor` is the last id handled.
    cursor = models.BigIntegerField(default=0)
    resent = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=8, choices=BulkStatus.choices, default=BulkStatus.PENDING)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Moves with every chunk: a RUNNING job whose row stopped moving lost its task (see bulk.stalled).
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"bulk resend #{self.pk} ({self.status})"

    @property
    def processed(self) -> int:
        return self.resent + self.refused + self.skipped

    @property
    def percent(self) -> int:
        if self.status == BulkStatus.DONE or not self.total:
            return 100 if self.status == BulkStatus.DONE else 0
        return min(99, int(100 * self.processed / self.total))
