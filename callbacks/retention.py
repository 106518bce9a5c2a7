"""Retention of deliveries: finished ones (SUCCEEDED, or FAILED and not replayed) go with their attempts
after CALLBACKS_RETENTION_DAYS, 1,000 per statement (`FOR UPDATE SKIP LOCKED`: one being replayed is left
for the next pass), found through the BRIN index on created_at, within RETENTION_PASS_SECONDS. PENDING
deliveries are never deleted: they are still owed."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from pilot_status.database import delete_in_batches

BATCH = 1000

# Django's foreign keys are checked at commit (DEFERRABLE INITIALLY DEFERRED), so one statement takes
# a delivery and its attempts together.
_PRUNE = """
WITH gone AS (
    SELECT id FROM callbacks_delivery
     WHERE created_at < %(cutoff)s AND status IN ('SUCCEEDED', 'FAILED')
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM callbacks_deliveryattempt WHERE delivery_id = ANY(ARRAY(SELECT id FROM gone))
)
DELETE FROM callbacks_delivery WHERE id = ANY(ARRAY(SELECT id FROM gone))
"""


def prune_deliveries(budget_s: float | None = None, batch: int = BATCH) -> int:
    budget = budget_s if budget_s is not None else settings.RETENTION_PASS_SECONDS
    cutoff = timezone.now() - timedelta(days=settings.CALLBACKS_RETENTION_DAYS)
    return delete_in_batches(_PRUNE, {"cutoff": cutoff}, batch, budget)
