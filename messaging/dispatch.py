"""The outbox relay: move due work from Postgres to the lane queues (design.md §2, §4, §5).

`release_due` is one unit of work. Per lane it:
- keeps the lane's broker queue shallow: at most `RELAY_LANE_DEPTH` ready tasks, so that what is
  released next is decided here, in Postgres, where it can still be fair;
- picks due rows round-robin by project: row 1 of every project, then row 2 of every project, …
  so one project's 100,000-message blast (over however many instances) takes its turn like
  everyone else (urgent rows first within a turn);
- paces each instance with a token bucket (`sending.pacing`), so a backlog released by a
  reconnect or the end of an outage reaches Evolution at the instance's rate cap;
- claims the chosen rows with SKIP LOCKED (several relays may run), publishes one task per row
  and deletes the rows in the same transaction.
If publishing fails the transaction rolls back and the rows wait for the next pass; if the relay
dies after publishing but before committing, a task is published twice and the worker's lease
claim turns the second into a no-op. Rows held back (depth or pace) simply stay due.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from pilot_status.celery import LANES, SEND_TASK, app

from .models import EventKind, Message, MessageEvent, OutboxEntry
from .sending import pacing

log = logging.getLogger(__name__)

# How many candidates per free slot the relay looks at: rows of a paced-out instance are skipped,
# and the rows behind them must still be reachable in the same pass.
_CANDIDATES_PER_SLOT = 4

_ROUND_ROBIN = """
WITH due AS (
    SELECT o.id, o.message_id, o.priority, o.available_at, o.project_id_copy, m.instance_id,
           i.send_rate_per_second,
           -- Turns are per project, not per (project, instance): a blast spread over many
           -- instances must not get one turn per instance and starve a project with one.
           ROW_NUMBER() OVER (PARTITION BY o.project_id_copy
                              ORDER BY o.priority DESC, o.available_at, o.id) AS turn
    FROM messaging_outboxentry o
    JOIN messaging_message m ON m.id = o.message_id
    JOIN messaging_instance i ON i.id = m.instance_id
    WHERE o.lane = %s AND o.available_at <= %s
)
SELECT id, message_id, instance_id, send_rate_per_second FROM due
WHERE turn <= %s
ORDER BY turn, priority DESC, available_at, id
LIMIT %s
"""


@dataclass
class Release:
    released: int = 0
    held: int = 0  # due rows left in the outbox this pass (lane full or instance paced)

    def __add__(self, other: Release) -> Release:
        return Release(self.released + other.released, self.held + other.held)


@dataclass(frozen=True)
class Candidate:
    pk: int
    message_id: str
    instance_id: int
    rate: float | None


def lane_depths(lanes: tuple[str, ...]) -> dict[str, int]:
    """Ready (unclaimed) tasks in each lane's broker queue."""
    queues = {queue.name: queue for queue in app.conf.task_queues}
    depths: dict[str, int] = {}
    with app.pool.acquire(block=True) as conn:
        channel = conn.default_channel  # type: ignore[attr-defined]  # app.pool yields Connections
        for lane in lanes:
            bound = queues[lane](channel)
            bound.declare()
            depths[lane] = int(bound.queue_declare(passive=True).message_count)
    return depths


def round_robin_candidates(lane: str, now: datetime, slots: int) -> list[Candidate]:
    with connection.cursor() as cursor:
        cursor.execute(_ROUND_ROBIN, [lane, now, slots, slots * _CANDIDATES_PER_SLOT])
        return [Candidate(pk, str(mid), iid, rate) for pk, mid, iid, rate in cursor.fetchall()]


def paced(candidates: list[Candidate], slots: int) -> list[Candidate]:
    """Keep candidates in order while their instance has tokens, up to `slots` rows."""
    wanted: dict[int, int] = defaultdict(int)
    for candidate in candidates[:]:
        wanted[candidate.instance_id] += 1
    rates = {c.instance_id: c.rate for c in candidates}
    granted = {iid: pacing.take(iid, min(count, slots), rates[iid]) for iid, count in wanted.items()}
    chosen: list[Candidate] = []
    for candidate in candidates:
        if len(chosen) >= slots:
            break
        if granted[candidate.instance_id] > 0:
            granted[candidate.instance_id] -= 1
            chosen.append(candidate)
    return chosen


def release_lane(lane: str, slots: int, now: datetime) -> Release:
    if slots <= 0:
        waiting = OutboxEntry.objects.filter(lane=lane, available_at__lte=now).exists()
        return Release(0, int(waiting))
    candidates = round_robin_candidates(lane, now, slots)
    if not candidates:
        return Release()
    # Released means due. A row made due early (a reconnect) must be claimable the moment its
    # task lands, and a worker may get the task before the release below commits: commit this first.
    Message.objects.filter(pk__in=[c.message_id for c in candidates], next_attempt_at__gt=now).update(
        next_attempt_at=now
    )
    with transaction.atomic():
        locked = set(
            OutboxEntry.objects.select_for_update(skip_locked=True)
            .filter(pk__in=[c.pk for c in candidates])
            .values_list("pk", flat=True)
        )
        chosen = paced([c for c in candidates if c.pk in locked], slots)
        held = len(candidates) - len(chosen)
        if len(candidates) == slots * _CANDIDATES_PER_SLOT:
            held += 1  # more may be waiting beyond what we looked at
        if not chosen:
            return Release(0, held)
        with app.producer_or_acquire() as producer:
            for candidate in chosen:
                app.send_task(
                    SEND_TASK, args=[candidate.message_id], queue=lane, routing_key=lane, producer=producer
                )
        message_ids = [c.message_id for c in chosen]
        Message.objects.filter(pk__in=message_ids).update(dispatched_at=now)
        OutboxEntry.objects.filter(pk__in=[c.pk for c in chosen]).delete()
        MessageEvent.objects.bulk_create(
            [
                MessageEvent(message_id=mid, kind=EventKind.DISPATCHED, detail={"lane": lane}, created_at=now)
                for mid in message_ids
            ]
        )
    return Release(len(chosen), held)


def release_due(limit: int = 200, lanes: tuple[str, ...] = LANES) -> Release:
    """One pass over the lanes (OTP first); returns what was released and what was held back."""
    now = timezone.now()
    depths = lane_depths(lanes)
    total = Release()
    for lane in lanes:
        slots = min(limit, settings.RELAY_LANE_DEPTH - depths[lane])
        total += release_lane(lane, slots, now)
    return total


def next_due_at() -> datetime | None:
    """When the earliest waiting entry becomes due (the relay sleeps until then at most)."""
    return OutboxEntry.objects.order_by("available_at").values_list("available_at", flat=True).first()


def release_all_due(limit: int = 200) -> Release:
    """Release passes until nothing more can go now; returns the total."""
    total = Release()
    while True:
        result = release_due(limit)
        total += result
        if result.released == 0 or result.held:
            return total


def close_connection_if_broken() -> None:
    # After a database outage Django keeps the dead connection until asked; drop it.
    if connection.connection is not None and not connection.is_usable():
        connection.close()
