"""A number's health: the signals the health governor counts (messaging.governor) and the changes of its
health state."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..choices import HealthState, SignalKind
from .tenants import Instance


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
