"""Long-running outbox relay: wakes on LISTEN/NOTIFY, polls as a fallback, exits cleanly on SIGTERM."""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from messaging import dispatch
from messaging.inserts import OUTBOX_CHANNEL
from pilot_status import heartbeats
from pilot_status.celery import LANES
from pilot_status.collector import freeze_startup_objects

log = logging.getLogger("messaging.relay")

# A tenth of a second: a paced instance at 20/s gets 2 tokens per look, a drained lane refills fast.
HELD_RECHECK_SECONDS = 0.1
# A pass (releases until nothing more can go) longer than this is logged as a warning.
SLOW_PASS_SECONDS = 0.5
# Rows that come due at moments of their own (each unofficial number's next slot, a retry's backoff) are taken
# together: a bulk relay's timed wake comes no sooner than this after its last pass began, so a thousand numbers'
# slots cost a few passes a second instead of one pass each (bench B9). New work (a NOTIFY) still wakes it at once,
# and a relay that serves the OTP lane waits for no one.
DUE_GATHER_SECONDS = 0.2


class Command(BaseCommand):
    help = "Move due outbox entries to the lane queues."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="release what is due and exit")
        parser.add_argument(
            "--lanes", default=",".join(LANES),
            help="comma-separated lanes this relay releases (default: all). One relay per lane group keeps a "
                 "slow pass over a big marketing backlog from holding an OTP back (bench B3).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        lanes = tuple(lane.strip() for lane in options["lanes"].split(",") if lane.strip())
        unknown = set(lanes) - set(LANES)
        if unknown or not lanes:
            raise CommandError(f"--lanes: expected some of {', '.join(LANES)}, got {options['lanes']!r}")
        self.lanes = lanes
        if options["once"]:
            self.stdout.write(str(dispatch.release_all_due(settings.RELAY_BATCH_SIZE, lanes).released))
            return
        freeze_startup_objects()
        self.stopping = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        log.info("relay started (lanes %s)", ", ".join(lanes))
        # Written after each pass that reached the database: a relay that is killed, stuck, or cut
        # off from Postgres turns stale on the status page (pilot_status.heartbeats).
        heartbeat = heartbeats.Process(f"relay:{','.join(lanes)}")
        self.gather = 0.0 if "otp" in lanes else DUE_GATHER_SECONDS
        listener: psycopg.Connection[Any] | None = None
        while not self.stopping:
            try:
                if listener is None or listener.closed:
                    listener = self._listen()
                started = time.monotonic()
                result = dispatch.release_all_due(settings.RELAY_BATCH_SIZE, self.lanes)
                self._report_slow_pass(time.monotonic() - started, result)
                heartbeat.beat()
                self._wait(listener, held=result.held > 0, since_pass=time.monotonic() - started)
            except (DatabaseError, psycopg.Error) as exc:
                log.warning("relay: database unavailable (%s); retrying", exc.__class__.__name__)
                listener = None
                close_old_connections()
                dispatch.close_connection_if_broken()
                time.sleep(1)
            except Exception:
                # Broker down or anything else: the rows stay in the outbox; try again shortly.
                log.exception("relay: release failed; retrying")
                time.sleep(1)
        heartbeat.forget()
        log.info("relay stopped")

    def _report_slow_pass(self, seconds: float, result: dispatch.Release) -> None:
        # Every due message of these lanes waited this long. Bench B3 and B6 saw 0.5-1.8 s passes over a
        # marketing backlog and nothing said so; with the phases, the log named the release statement
        # (a plan on stale statistics, since fixed in dispatch).
        if seconds >= SLOW_PASS_SECONDS:
            phases = ", ".join(f"{name} {spent:.2f}" for name, spent in
                               sorted(result.phases.items(), key=lambda item: -item[1]))
            log.warning("relay: slow pass over %s: %.2f s (released %d, held %d; seconds in %s)",
                        ",".join(self.lanes), seconds, result.released, result.held, phases or "nothing")

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _listen(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(settings.DATABASE_URL, autocommit=True, connect_timeout=3)
        conn.execute(f"LISTEN {OUTBOX_CHANNEL}")
        return conn

    def _wait(self, listener: psycopg.Connection[Any], held: bool = False, since_pass: float = 0.0) -> None:
        if held:
            # Due work is held back (lane queue full or instance paced): look again soon, but
            # do not spin, since the held rows stay due.
            timeout = HELD_RECHECK_SECONDS
        else:
            due = dispatch.next_due_at(self.lanes)
            due_in = None if due is None else (due - timezone.now()).total_seconds()
            timeout = timed_wait(due_in, since_pass, settings.RELAY_POLL_SECONDS, self.gather)
            if timeout <= 0:
                return
        # A notification names the lane of its new row: another lane's is another relay's work.
        for notice in listener.notifies(timeout=timeout):
            if wakes(notice.payload, self.lanes):
                break


def wakes(lane: str, lanes: tuple[str, ...]) -> bool:
    """Whether a NOTIFY about a new row of `lane` is work for a relay of `lanes`. A lane this process does not know
    (a writer of another version) wakes it: a pass too many costs less than a row left to the poll."""
    return lane in lanes or lane not in LANES


def timed_wait(due_in: float | None, since_pass: float, poll: float, gather: float) -> float:
    """How long the relay sleeps unless a NOTIFY comes: until the next row comes due (`due_in` seconds; None: no row
    waits), at most `poll`, and at least `gather` after its last pass began (`since_pass` seconds ago)."""
    if due_in is None:
        return poll
    return min(poll, max(due_in, gather - since_pass, 0.0))
