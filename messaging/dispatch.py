"""The outbox relay: move due work from Postgres to the lane queues (docs/architecture.md, principles 2, 4, 5).

`release_due` is one unit of work. Per lane it:
- keeps the lane's broker queue shallow: at most `RELAY_LANE_DEPTH` ready tasks (`RELAY_LANE_DEPTH_OTP`
  for OTPs), so that what is released next is decided here, in Postgres, where it can still be fair;
- picks due rows round-robin by project: row 1 of every project, then row 2 of every project, …
  so one project's 100,000-message blast (over however many instances) takes its turn like
  everyone else (urgent rows first within a turn);
- paces each instance with a token bucket (`sending.pacing`), so a backlog released by a
  reconnect or the end of an outage reaches Evolution at the instance's rate cap;
- claims the chosen rows with SKIP LOCKED (several relays may run), publishes one task per row
  and releases the rows in the same transaction (`lifecycle.release`: out of the outbox, their
  messages stamped dispatched).
The release commits only once the broker has confirmed every task of it (`lane_publisher`): if
publishing fails or is not confirmed the transaction rolls back and the rows wait for the next pass;
if the relay dies after publishing but before committing, a task is published twice and the worker's
lease claim turns the second into a no-op. Rows held back (depth or pace) simply stay due.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from pilot_status.celery import LANES, app

from . import lifecycle
from .lane_publisher import LanePublisher
from .models import Message, OutboxEntry
from .sending import human_pace, pacing, policy

log = logging.getLogger(__name__)

# How many candidates per free slot the relay looks at: rows of a paced-out instance are skipped,
# and the rows behind them must still be reachable in the same pass.
_CANDIDATES_PER_SLOT = 4

# The first rows of every project with due work in a lane, without reading the whole backlog:
# a skip scan finds the projects (one index probe each), then each project's first rows come
# from the same index in release order. A 100,000-row blast costs the same as a 10-row one.
_TURNS = """
WITH RECURSIVE projects(pid) AS (
    (SELECT project_id_copy FROM messaging_outboxentry
      WHERE lane = %(lane)s AND available_at <= %(now)s
      ORDER BY project_id_copy LIMIT 1)
    UNION ALL
    SELECT (SELECT o.project_id_copy FROM messaging_outboxentry o
             WHERE o.lane = %(lane)s AND o.available_at <= %(now)s AND o.project_id_copy > projects.pid
             ORDER BY o.project_id_copy LIMIT 1)
    FROM projects WHERE projects.pid IS NOT NULL
)
SELECT c.id, c.message_id, p.pid, c.turn
FROM projects p
CROSS JOIN LATERAL (
    SELECT o.id, o.message_id,
           ROW_NUMBER() OVER (ORDER BY o.priority DESC, o.available_at, o.id) AS turn
    FROM messaging_outboxentry o
    WHERE o.lane = %(lane)s AND o.project_id_copy = p.pid AND o.available_at <= %(now)s
    ORDER BY o.priority DESC, o.available_at, o.id
    -- Enough rows per project to fill the pass whatever the mix, fewer when many projects wait.
    LIMIT GREATEST(%(slots)s, %(budget)s / (SELECT count(*) FROM projects WHERE pid IS NOT NULL))
) c
WHERE p.pid IS NOT NULL
ORDER BY c.turn, p.pid
"""
# What the relay needs of the candidates' messages, by primary key. A separate statement on purpose:
# joined into the query above, the planner (misled by the recursive CTE's row estimate, or by stale
# statistics right after a bulk insert) may read the whole message table on every pass.
_CANDIDATE_MESSAGES = """
SELECT m.id, m.instance_id, (i.send_policy->>'rate_per_second')::float8, i.send_rate_per_second,
       m.next_attempt_at > %(now)s, i.send_profile = 'unofficial', m.deliver_until,
       m."to", m.requested_instance <> '', m.category
FROM messaging_message m JOIN messaging_instance i ON i.id = m.instance_id
WHERE m.id = ANY(%(ids)s)
"""


@dataclass
class Release:
    released: int = 0
    held: int = 0  # due rows left in the outbox this pass (lane full or instance paced)
    # Seconds spent per phase (depths, candidates, lock, pace, publish, commit): what a slow pass
    # log line shows, so that the next slow pass says where its time went.
    phases: dict[str, float] = field(default_factory=dict)
    # A lane released as many rows as it had slots: more may be due behind them. A pass that released
    # fewer, holding none back, took every row due when it looked.
    filled: bool = False

    def __add__(self, other: Release) -> Release:
        phases = dict(self.phases)
        for name, seconds in other.phases.items():
            phases[name] = phases.get(name, 0.0) + seconds
        return Release(self.released + other.released, self.held + other.held, phases, self.filled or other.filled)


class _Clock:
    """Adds the time between marks to named phases."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.last = time.monotonic()

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now


@dataclass(frozen=True)
class Candidate:
    pk: int
    message_id: str
    instance_id: int
    rate: float  # its number's sends per second (sending.policy.rate)
    project_id: int = 0
    turn: int = 1
    early: bool = False  # made due before its message's next_attempt_at (a reconnect)
    human: bool = False  # an unofficial number: released one at a time by its sending policy (human_pace)
    deliver_until: datetime | None = None
    # Its recipient, as human_pace judges it: a cold contact of its number or not, and whether the sticky sender may
    # move it (its client did not name the instance; MARKETING goes through no shared number).
    to: str = ""
    pinned: bool = False
    category: str = ""


class TurnOrder:
    """Which project goes first within a turn: the one this relay released least recently.

    Row age alone would let a project whose backlog is older win every pass that has fewer free
    slots than projects, starving a newcomer (found by bench B6). Kept in the relay's memory: a
    restarted relay, or a second one, starts from row age again, which is fair enough for a pass.
    """

    def __init__(self) -> None:
        self.clock = 0
        self.last_released: dict[tuple[str, int], int] = {}

    def arrange(self, lane: str, candidates: list[Candidate]) -> list[Candidate]:
        # Stable sort: within a turn and a tie (never released), the query's order (row age) stays.
        return sorted(candidates, key=lambda c: (c.turn, self.last_released.get((lane, c.project_id), -1)))

    def released(self, lane: str, chosen: list[Candidate]) -> None:
        for candidate in chosen:
            self.clock += 1
            self.last_released[(lane, candidate.project_id)] = self.clock


turn_order = TurnOrder()


_publisher: LanePublisher | None = None


def lane_publisher() -> LanePublisher:
    """This process's confirm-mode publisher (one connection, kept across passes)."""
    global _publisher
    if _publisher is None:
        _publisher = LanePublisher(settings.RELAY_CONFIRM_TIMEOUT_SECONDS)
    return _publisher


# Lanes whose queue (with its exchange and binding: three round trips) this process has declared.
# A relay pass only needs the depth, one passive declare; every OTP costs two passes.
_declared: set[str] = set()


def lane_depths(lanes: tuple[str, ...]) -> dict[str, int]:
    """Ready (unclaimed) tasks in each lane's broker queue."""
    queues = {queue.name: queue for queue in app.conf.task_queues}
    depths: dict[str, int] = {}
    with app.pool.acquire(block=True) as conn:
        channel = conn.default_channel  # type: ignore[attr-defined]  # app.pool yields Connections
        for lane in lanes:
            bound = queues[lane](channel)
            if lane not in _declared:
                bound.declare()
                _declared.add(lane)
            try:
                depths[lane] = int(bound.queue_declare(passive=True).message_count)
            except Exception:
                # Gone (a broker reset, a deleted vhost): declare it again on the next pass.
                _declared.clear()
                raise
    return depths


# The outbox is a queue: autovacuum often analyzes it just drained, or while a bulk insert is still
# uncommitted, and records zero rows over many pages. Until the next analyze (up to a minute) the
# planner prices every outbox and message scan at one row and the turn query sorts the whole lane
# per project. A pass that reads more rows than Postgres believes exist refreshes the statistics.
STATISTICS_CHECK_SECONDS = 30.0
_statistics_checked_at = -STATISTICS_CHECK_SECONDS
_ESTIMATES = """
SELECT relname, reltuples FROM pg_class
 WHERE oid IN ('messaging_outboxentry'::regclass, 'messaging_message'::regclass)
"""


def refresh_blind_statistics(seen: int) -> list[str]:
    """ANALYZE the outbox and message tables if Postgres believes they hold fewer than `seen` rows
    (checked at most every STATISTICS_CHECK_SECONDS); returns the tables analyzed."""
    global _statistics_checked_at
    if time.monotonic() - _statistics_checked_at < STATISTICS_CHECK_SECONDS:
        return []
    _statistics_checked_at = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(_ESTIMATES)
        blind = sorted(name for name, rows in cursor.fetchall() if rows < seen)
        for name in blind:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(name)}")
    if blind:
        log.info("relay: statistics of %s were blind to a backlog (read %d rows); analyzed", ", ".join(blind), seen)
    return blind


def round_robin_candidates(lane: str, now: datetime, slots: int) -> tuple[list[Candidate], bool]:
    """Up to `slots` × _CANDIDATES_PER_SLOT due rows, turn by turn, least recently served project
    first within a turn; and whether more due rows may wait beyond them."""
    budget = slots * _CANDIDATES_PER_SLOT
    with connection.cursor() as cursor:
        cursor.execute(_TURNS, {"lane": lane, "now": now, "slots": slots, "budget": budget})
        turns = cursor.fetchall()
        if not turns:
            return [], False
        cursor.execute(_CANDIDATE_MESSAGES, {"now": now, "ids": [mid for _, mid, _, _ in turns]})
        messages = {mid: row for mid, *row in cursor.fetchall()}
    default = settings.SEND_RATE_PER_INSTANCE
    rows = [
        Candidate(pk, str(mid), messages[mid][0], policy.rate(messages[mid][1], messages[mid][2], default),
                  project_id=pid, turn=turn, early=messages[mid][3], human=messages[mid][4],
                  deliver_until=messages[mid][5], to=messages[mid][6], pinned=messages[mid][7],
                  category=messages[mid][8])
        for pk, mid, pid, turn in turns
        if mid in messages
    ]
    per_project = max(slots, budget // max(1, len({c.project_id for c in rows})))
    truncated = any(c.turn == per_project for c in rows) or len(rows) > budget
    if truncated:  # a backlog: the moment wrong statistics cost the most
        refresh_blind_statistics(len(turns))
    return turn_order.arrange(lane, rows)[:budget], truncated


def paced(candidates: list[Candidate], slots: int, lane: str) -> list[Candidate]:
    """Keep candidates in order while their instance has tokens, up to `slots` rows. OTPs may borrow from
    their instance's future (`pacing.take_many`): an OTP never waits for the tokens a marketing backlog on
    the same number drew first."""
    wanted: dict[int, int] = defaultdict(int)
    for candidate in candidates[:]:
        wanted[candidate.instance_id] += 1
    rates = {c.instance_id: c.rate for c in candidates}
    granted = pacing.take_many({iid: (min(count, slots), rates[iid]) for iid, count in wanted.items()},
                               priority=lane == "otp")
    chosen: list[Candidate] = []
    for candidate in candidates:
        if len(chosen) >= slots:
            break
        if granted[candidate.instance_id] > 0:
            granted[candidate.instance_id] -= 1
            chosen.append(candidate)
    return chosen


def release_lane(lane: str, slots: int, now: datetime) -> Release:
    clock = _Clock()
    if slots <= 0:
        waiting = OutboxEntry.objects.filter(lane=lane, available_at__lte=now).exists()
        clock.mark("candidates")
        return Release(0, int(waiting), clock.phases)
    candidates, truncated = round_robin_candidates(lane, now, slots)
    clock.mark("candidates")
    if not candidates:
        return Release(phases=clock.phases)
    # Released means due. A row made due early (a reconnect) must be claimable the moment its
    # task lands, and a worker may get the task before the release below commits: commit this first.
    early = [c.message_id for c in candidates if c.early]
    if early:
        Message.objects.filter(pk__in=early, next_attempt_at__gt=now).update(next_attempt_at=now)
    with transaction.atomic():
        locked = set(
            OutboxEntry.objects.select_for_update(skip_locked=True)
            .filter(pk__in=[c.pk for c in candidates])
            .values_list("pk", flat=True)
        )
        clock.mark("lock")
        mine = [c for c in candidates if c.pk in locked]
        chosen = paced([c for c in mine if not c.human], slots, lane)
        human = [c for c in mine if c.human]
        later: dict[Candidate, human_pace.Hold] = {}
        if human:
            let_go, later = human_pace.release(human, slots - len(chosen), lane, now)
            chosen += let_go
            human_pace.hold(later, now)  # not due now: no longer counted as held back
        clock.mark("pace")
        held = len(candidates) - len(chosen) - len(later)
        if truncated:
            held += 1  # more may be waiting beyond what we looked at
        if not chosen:
            return Release(0, held, clock.phases)
        # Released before the publish, in the same transaction: the message rows stay locked until the commit,
        # so a worker's claim waits for it and no DISPATCHED line can follow the lines of an attempt that
        # answered at once (a nack or a timeout still rolls all of it back).
        lifecycle.release([c.pk for c in chosen], lane, now)
        lane_publisher().publish(lane, (candidate.message_id for candidate in chosen))
        clock.mark("publish")
    clock.mark("commit")
    turn_order.released(lane, chosen)  # committed: these projects have had their turn
    return Release(len(chosen), held, clock.phases, filled=len(chosen) >= slots)


def lane_depth_limit(lane: str) -> int:
    """How many ready tasks the relay keeps in a lane's queue at most."""
    return settings.RELAY_LANE_DEPTH_OTP if lane == "otp" else settings.RELAY_LANE_DEPTH


def release_due(limit: int = 200, lanes: tuple[str, ...] = LANES) -> Release:
    """One pass over the lanes (OTP first); returns what was released and what was held back."""
    now = timezone.now()
    started = time.monotonic()
    depths = lane_depths(lanes)
    total = Release(phases={"depths": time.monotonic() - started})
    for lane in lanes:
        slots = min(limit, lane_depth_limit(lane) - depths[lane])
        total += release_lane(lane, slots, now)
    return total


def next_due_at(lanes: tuple[str, ...] = LANES) -> datetime | None:
    """When the earliest waiting entry of these lanes becomes due (the relay sleeps until then at most)."""
    rows = OutboxEntry.objects.filter(lane__in=lanes).order_by("available_at")
    return rows.values_list("available_at", flat=True).first()


def release_all_due(limit: int = 200, lanes: tuple[str, ...] = LANES) -> Release:
    """Release passes over these lanes until nothing more can go now; returns the total. A pass that took every
    due row ends it: rows that come due later wake the relay (their NOTIFY, or `next_due_at`)."""
    total = Release()
    while True:
        result = release_due(limit, lanes)
        total += result
        if result.released == 0 or result.held or not result.filled:
            return total


def close_connection_if_broken() -> None:
    # After a database outage Django keeps the dead connection until asked; drop it.
    if connection.connection is not None and not connection.is_usable():
        connection.close()
