"""Retention of the inbox (issue 22): processed events go after INBOX_RETENTION_DAYS.

The inbox holds raw payloads, inbound customer messages among them; once processed, a row only
serves dedup, and Evolution stops redelivering an event within hours (its webhook retries end after
about ten attempts). Unprocessed rows are kept whatever their age: the ingestion reconciler still owes
them a forward (one it gave up on is processed, outcome `dead`: ingestion.reconciler). Each statement deletes at most BATCH rows picked `FOR UPDATE SKIP LOCKED` through the
BRIN index on received_at (a row being processed is left for the next pass); a pass stops at
RETENTION_PASS_SECONDS.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from pilot_status.database import delete_in_batches

BATCH = 1000

# = ANY(ARRAY(...)), not IN (SELECT ...): the delete reaches its rows by primary key (with IN the
# planner may hash-join the subquery against the whole table).
_PRUNE = """
DELETE FROM evolution_ingestion_events WHERE id = ANY(ARRAY(
    SELECT id FROM evolution_ingestion_events
     WHERE received_at < %(cutoff)s AND processed_at IS NOT NULL
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
))
"""


def prune_inbox(budget_s: float | None = None, batch: int = BATCH) -> int:
    budget = budget_s if budget_s is not None else settings.RETENTION_PASS_SECONDS
    cutoff = timezone.now() - timedelta(days=settings.INBOX_RETENTION_DAYS)
    return delete_in_batches(_PRUNE, {"cutoff": cutoff}, batch, budget)
