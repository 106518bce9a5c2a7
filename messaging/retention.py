"""Retention of the timelines (issue 22): the lines of finished messages go after TIMELINE_RETENTION_DAYS.

Finished: DELIVERED or READ; SENT/SERVER_ACK once status sync stopped asking; FAILED once its dead
letter is resolved (a FAILED message with an OPEN dead letter keeps its timeline: a person still has to
look at it). The message row itself stays, so `GET /v1/messages/{id}` still answers its status, reason
and times (with the lines that are left); only its lines older than the horizon are deleted.

Each statement deletes at most BATCH lines picked `FOR UPDATE SKIP LOCKED` (a line someone holds is
left for the next pass; messages and dead letters are read, never locked), found through the BRIN
index on created_at; a pass stops at RETENTION_PASS_SECONDS. Every statement commits on its own.
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
DELETE FROM messaging_messageevent WHERE id = ANY(ARRAY(
    SELECT e.id
      FROM messaging_messageevent e
      JOIN messaging_message m ON m.id = e.message_id
      LEFT JOIN messaging_deadletter d ON d.message_id = m.id
     WHERE e.created_at < %(cutoff)s
       AND (m.status IN ('DELIVERED', 'READ')
            OR (m.status IN ('SENT', 'SERVER_ACK') AND m.status_sync_stopped_at IS NOT NULL)
            OR (m.status = 'FAILED' AND d.status IS DISTINCT FROM 'OPEN'))
     LIMIT %(batch)s
       FOR UPDATE OF e SKIP LOCKED
))
"""


def prune_timelines(budget_s: float | None = None, batch: int = BATCH) -> int:
    """Delete old lines of finished messages, a batch per statement, until none is left or the
    budget is spent; returns how many went."""
    budget = budget_s if budget_s is not None else settings.RETENTION_PASS_SECONDS
    cutoff = timezone.now() - timedelta(days=settings.TIMELINE_RETENTION_DAYS)
    return delete_in_batches(_PRUNE, {"cutoff": cutoff}, batch, budget)
