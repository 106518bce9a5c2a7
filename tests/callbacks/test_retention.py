"""Finished deliveries go with their attempts after CALLBACKS_RETENTION_DAYS; pending ones stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks import retention
from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)


def test_old_finished_deliveries_and_their_attempts_go_pending_ones_stay(settings, alice):
    settings.CALLBACKS_RETENTION_DAYS = 30
    endpoint = WebhookEndpoint.objects.create(project=alice.project, url="https://hooks.example.com/", event_types=["message.status"])
    old = timezone.now() - timedelta(days=31)
    rows = {}
    for status, created_at in [("SUCCEEDED", old), ("FAILED", old), ("PENDING", old), ("SUCCEEDED", timezone.now())]:
        delivery = Delivery.objects.create(
            endpoint=endpoint, event_type="message.status", source=f"event:{len(rows)}", status=status, payload={}
        )
        Delivery.objects.filter(pk=delivery.pk).update(created_at=created_at)
        DeliveryAttempt.objects.create(delivery=delivery, url=endpoint.url)
        rows[(status, created_at == old)] = delivery.pk

    assert retention.prune_deliveries(batch=1) == 2
    assert set(Delivery.objects.values_list("pk", flat=True)) == {rows[("PENDING", True)], rows[("SUCCEEDED", False)]}
    assert DeliveryAttempt.objects.count() == 2
