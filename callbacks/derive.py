"""The relay pass's first half: deliveries written from rows that are already durable.

A status change is committed with its timeline line (messaging.lifecycle's moves; one
statement on the hot path), an inbound message with its inbox row, a revocation with its opt-in row, a send
WhatsApp never acknowledged with its message's `unacknowledged_at` (messaging.unacknowledged), a change of a
number's health with its InstanceHealthEvent (messaging.governor). Deliveries are
derived from those rows afterwards, so the hot paths (accept, compare-and-set) write nothing more
than they did (bench B3), and a change that committed has its line: nothing is lost between the two.

Each event type's read and the deliveries written from its rows are callbacks.derive_events, their JSON bodies
callbacks.derive_payloads; this module runs the pass and moves the cursors.

Safe to run twice: one delivery per (endpoint, source row) (`one_delivery_per_source`, ON CONFLICT DO
NOTHING), and the cursor only says where reading may start.

Late commits. A timeline id is taken when the row is written, not when it commits, so a reader that
sees id 51 may later see 50 appear. The cursor therefore moves in two steps (`_step`): a read takes
every visible row past `position` and remembers its last id with the snapshot's `xmax` (the first
transaction id not finished when it looked). A later read that starts after every transaction below
that `xmax` has finished (`pg_snapshot_xmin` reached it) sees every row up to that id that will ever
commit, so once it has read them `position` moves there. Until then the same rows are read again, and
the unique key keeps them from counting twice (within one pass, the rows it has already read are
left out of the next read, which goes on past them instead). Opt-in revocations are updates, so their
cursor is a time (`revoked_at`, in microseconds), kept SKEW behind for the clocks of the processes that
write it, with the same two-step rule.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from django.db import connection
from django.utils import timezone

from .derive_events import (
    BATCH,
    SKEW,
    Read,
    Rows,
    _health_deliveries,
    _health_rows,
    _inbound_deliveries,
    _inbound_rows,
    _micros,
    _opt_out_deliveries,
    _opt_out_rows,
    _status_deliveries,
    _status_rows,
    _unacknowledged_deliveries,
    _unacknowledged_rows,
)
from .models import EventType, RelayCursor, WebhookEndpoint

# How many rows past its position one pass may read while an unfinished transaction holds the position
# back (the ids it skips are sent with each read).
READ_AHEAD = 10 * BATCH
_LOCK = 0x63616C6C  # "call": the advisory lock that keeps relay passes one at a time


@dataclass
class Derived:
    status: int = 0
    inbound: int = 0
    opt_outs: int = 0
    unacknowledged: int = 0
    health: int = 0


def run(budget_seconds: float = 2.0) -> Derived:
    """One pass over the three sources, within its time budget (the next pass goes on)."""
    done = Derived()
    with connection.cursor() as cursor:
        # One pass at a time (beat ticks every second; a pass may take longer): a second one would
        # only read the same rows again.
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_LOCK])
        if not cursor.fetchone()[0]:
            return done
    try:
        return _run(done, budget_seconds)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_LOCK])


def _run(done: Derived, budget_seconds: float) -> Derived:
    deadline = time.monotonic() + budget_seconds
    # The timeline is always read: a send's callbackUrl needs no endpoint registered beforehand.
    done.status = _by_id("timeline", _status_rows, _status_deliveries, deadline)
    wanted = _wanted_event_types()
    # A source no enabled endpoint asks for owes nothing, but its cursor still moves, so that an
    # endpoint created later starts from its creation and not from the start of the table.
    if EventType.MESSAGE_INBOUND in wanted:
        done.inbound = _by_id("inbox", _inbound_rows, _inbound_deliveries, deadline)
    else:
        _skip_inbox_to_end()
    if EventType.OPT_IN_REVOKED in wanted:
        done.opt_outs = _opt_outs(deadline)
    else:
        _skip_opt_ins_to_end()
    if EventType.MESSAGE_UNACKNOWLEDGED in wanted:
        done.unacknowledged = _unacknowledged()
    else:
        _skip_to("unacknowledged", _micros(timezone.now() - SKEW))
    if EventType.INSTANCE_HEALTH in wanted:
        done.health = _by_id("health", _health_rows, _health_deliveries, deadline)
    else:
        _skip_health_to_end()
    return done


def _wanted_event_types() -> set[str]:
    wanted: set[str] = set()
    for types in WebhookEndpoint.objects.filter(enabled=True, per_message=False).values_list("event_types", flat=True):
        wanted.update(types)
    return wanted


# --- the two-step cursor ------------------------------------------------------------------------


def _snapshot_xmax() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        return int(cursor.fetchone()[0])


def _all_finished_below(xmax: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint >= %s", [xmax])
        return bool(cursor.fetchone()[0])


def _cursor(name: str) -> RelayCursor:
    cursor, _ = RelayCursor.objects.get_or_create(name=name)
    return cursor


_CURSOR_FIELDS = ["position", "pending_position", "pending_xmax", "updated_at"]


# A read: the position to read past, and the ids past it that this pass has already read (and written).
Reader = Callable[[int, list[int]], Read]


def _step(cursor: RelayCursor, read: Reader, write: Callable[[Rows], int], seen: set[int]) -> tuple[Read, int]:
    """Read every visible row past `position` (but those in `seen`) and write its deliveries. If every
    transaction that was unfinished when the previous read looked has finished since (checked before
    this read, so all their rows are visible to it), the rows up to that read's last one have all been
    seen now: `position` moves there. This read's last row becomes the next candidate."""
    settled = cursor.pending_xmax is not None and _all_finished_below(cursor.pending_xmax)
    got = read(cursor.position, sorted(i for i in seen if i > cursor.position))
    written = write(got.rows)
    seen.update(got.ids)
    if settled:
        # A read that stopped at BATCH rows covered only up to its last one. Any other covered every
        # visible row (those in `seen` were read and written before), so the candidate is reached
        # whatever it returned.
        reached = cursor.pending_position
        if got.full and got.last is not None:
            reached = min(reached, got.last)
        cursor.position = max(cursor.position, reached)
        cursor.pending_xmax = None
    if got.last is not None and got.last > cursor.position:
        cursor.pending_position, cursor.pending_xmax = got.last, _snapshot_xmax()
    cursor.save(update_fields=_CURSOR_FIELDS)
    return got, written


def _by_id(name: str, read: Reader, write: Callable[[Rows], int], deadline: float) -> int:
    """Steps until everything read is settled, or the budget is spent. A backlog is read batch after
    batch; while a transaction that was in flight holds the position back, a full read goes on past
    it (its rows owe deliveries now), up to READ_AHEAD rows."""
    cursor = _cursor(name)
    seen: set[int] = set()  # the rows this pass has written: read again, they would only be written again
    written = 0
    while True:
        got, count = _step(cursor, read, write, seen)
        written += count
        seen -= {i for i in seen if i <= cursor.position}  # never read again
        if time.monotonic() > deadline:
            return written
        if cursor.pending_xmax is None:
            if got.full:
                continue  # a backlog: the next batch at once
            return written  # everything read is settled
        # Usually the writers that were in flight finish within milliseconds: wait a little for
        # them and go on; else read ahead while there is more, or leave it to the next pass.
        for _ in range(5):
            if _all_finished_below(cursor.pending_xmax) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if time.monotonic() > deadline:
            return written
        if not _all_finished_below(cursor.pending_xmax) and (not got.full or len(seen) >= READ_AHEAD):
            return written


def _skip_to(name: str, last: int) -> None:
    cursor = _cursor(name)
    if last > cursor.position or cursor.pending_xmax is not None:
        cursor.position, cursor.pending_position, cursor.pending_xmax = max(cursor.position, last), 0, None
        cursor.save(update_fields=_CURSOR_FIELDS)


def _skip_inbox_to_end() -> None:
    with connection.cursor() as db:
        db.execute("SELECT coalesce(max(id), 0) FROM evolution_ingestion_events")
        _skip_to("inbox", int(db.fetchone()[0]))


def _skip_opt_ins_to_end() -> None:
    _skip_to("opt_ins", _micros(timezone.now() - SKEW))


def _skip_health_to_end() -> None:
    with connection.cursor() as db:
        db.execute("SELECT coalesce(max(id), 0) FROM messaging_instancehealthevent")
        _skip_to("health", int(db.fetchone()[0]))


def _opt_outs(deadline: float) -> int:
    # Revocations are rare: one step per pass (the window SKEW behind is read again each time).
    return _step(_cursor("opt_ins"), _opt_out_rows, _opt_out_deliveries, set())[1]


def _unacknowledged() -> int:
    # Rare, as revocations are: one step per pass.
    return _step(_cursor("unacknowledged"), _unacknowledged_rows, _unacknowledged_deliveries, set())[1]
