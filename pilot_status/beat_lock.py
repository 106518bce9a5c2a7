"""One beat per database: a Postgres advisory lock that beat holds for as long as it runs.

django-celery-beat's DatabaseScheduler keeps the schedule in Postgres but does not stop a second
`celery beat` from reading it too, and two beats send every maintenance tick twice (docs/scaling.md).
So beat takes a session-level advisory lock (`pg_try_advisory_lock`, scoped to the database) on a
connection of its own when it starts (`beat_init`, pilot_status/celery.py):
- taken by another beat → this one says who holds it and exits with status 3 (`LOCKED_EXIT`);
- held → before every tick (at most once a second) beat checks that the connection, and so the lock,
  is still there. When it is not (Postgres restarted, the network dropped), beat sends nothing, and
  on each later tick reconnects and takes the lock again; if another beat took it meanwhile, this one
  stops.
A beat that dies (even SIGKILL) closes its connection and Postgres drops the lock with it. A beat on a
machine that vanishes is found out by TCP keepalives set on both ends of the lock's connection
(client: `KEEPALIVES`; server: the session's `tcp_keepalives_*`), which free the lock within about
25 s, after the beat cut off has stopped ticking (about 11 s): the two never tick together.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

log = logging.getLogger(__name__)

# The lock's key: "PSBT" in ASCII; below 2**31, so pg_locks shows it as classid 0, objid LOCK_KEY.
LOCK_KEY = 0x50534254
LOCKED_EXIT = 3
CHECK_EVERY_SECONDS = 1.0
# The beat's side notices a dead server within keepalives_idle + interval × count = 5 + 2 × 3 = 11 s
# (tcp_user_timeout bounds an unacknowledged write at 10 s); the server frees the lock of a vanished
# beat within 10 + 5 × 3 = 25 s. Both are per-connection settings: nothing to configure in Postgres.
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
    "tcp_user_timeout": 10_000, "connect_timeout": 5,
    "options": "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3",
    "application_name": f"pilot_status beat lock on {socket.gethostname()}"[:63],
}


class AnotherBeatRuns(Exception):
    """Another beat holds the lock."""


def connection_params() -> dict[str, Any]:
    """psycopg.connect() arguments for Django's default database, plus the keepalives above."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    params: dict[str, Any] = {"dbname": db["NAME"], "user": db.get("USER") or None,
                              "password": db.get("PASSWORD") or None, "host": db.get("HOST") or None,
                              "port": db.get("PORT") or None}
    return {**{k: v for k, v in params.items() if v is not None}, **KEEPALIVES}


class BeatLock:
    def __init__(self, params: dict[str, Any], key: int = LOCK_KEY):
        self.params = params
        self.key = key
        self.conn: psycopg.Connection[Any] | None = None
        self.checked_at = 0.0

    def acquire(self) -> bool:
        """Connect and try the lock once: True when this session holds it now."""
        self.close()
        conn = psycopg.connect(autocommit=True, **self.params)
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", [self.key]).fetchone()
        if row is not None and row[0]:
            self.conn, self.checked_at = conn, time.monotonic()
            return True
        conn.close()
        return False

    def holder(self) -> str:
        """Who holds the lock, as Postgres sees it (for the refusal's message)."""
        try:
            with psycopg.connect(autocommit=True, **self.params) as conn:
                row = conn.execute(
                    "SELECT a.pid, a.application_name, a.client_addr::text, a.backend_start FROM pg_locks l "
                    "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                    "AND l.classid = 0 AND l.objid = %s AND l.objsubid = 1 AND l.database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())", [self.key]).fetchone()
        except psycopg.Error as exc:
            return f"unknown ({exc.__class__.__name__})"
        if row is None:
            return "nobody any more"
        pid, app, addr, since = row
        return f"{app or 'a session'} (Postgres backend {pid}, client {addr or 'local socket'}, since {since:%Y-%m-%d %H:%M:%S %Z})"

    def confirmed(self, now: float | None = None) -> bool:
        """Whether this beat may tick: the lock's connection answers (checked at most every
        CHECK_EVERY_SECONDS), or a new one took the lock again. AnotherBeatRuns when another beat took it."""
        now = time.monotonic() if now is None else now
        if self.conn is not None and now - self.checked_at < CHECK_EVERY_SECONDS:
            return True
        if self.conn is not None:
            try:
                self.conn.execute("SELECT 1")
                self.checked_at = now
                return True
            except psycopg.Error as exc:
                log.warning("beat lock: the lock's connection is gone (%s); no tick until it is taken again", exc)
                self.close()
        try:
            if self.acquire():
                log.warning("beat lock: taken again; ticking again")
                return True
        except psycopg.Error as exc:
            log.warning("beat lock: Postgres unreachable (%s); no tick until the lock is taken again", exc)
            return False
        raise AnotherBeatRuns(self.holder())

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg.Error:
                pass
            self.conn = None


def refusal(holder: str, database: str) -> str:
    return (f"beat: another beat already runs on database {database!r}: {holder} holds the schedule lock "
            f"(pg advisory lock {LOCK_KEY}). Only one beat may run per database (docs/scaling.md); exiting.")


def hold_or_exit(service: Any, lock: BeatLock | None = None, err: Any = None) -> BeatLock:
    """Take the lock for beat `service` (celery.beat.Service) and make its scheduler tick only while
    the lock is held; exit with LOCKED_EXIT when another beat holds it."""
    from django.conf import settings

    lock = lock or BeatLock(connection_params())
    database = str(settings.DATABASES["default"]["NAME"])
    err = err or sys.stderr
    try:
        acquired = lock.acquire()
    except psycopg.Error as exc:
        # Postgres away right now: start, but tick only once the lock is taken (the guard's first check).
        log.warning("beat lock: Postgres unreachable at start-up (%s); no tick until the lock is taken", exc)
        service.scheduler.tick = guarded_tick(service.scheduler.tick, lock, database, err)
        return lock
    if not acquired:
        message = refusal(lock.holder(), database)
        log.critical(message)
        err.write(message + "\n")
        err.flush()
        raise SystemExit(LOCKED_EXIT)
    log.info("beat lock: held on database %r (only this beat ticks)", database)
    scheduler = service.scheduler
    scheduler.tick = guarded_tick(scheduler.tick, lock, database, err)
    return lock


def guarded_tick(tick: Callable[..., Any], lock: BeatLock, database: str, err: Any) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            held = lock.confirmed()
        except AnotherBeatRuns as exc:
            message = refusal(str(exc), database)
            log.critical(message)
            err.write(message + "\n")
            raise SystemExit(LOCKED_EXIT) from None  # beat's loop stops on it and syncs the schedule
        return tick(*args, **kwargs) if held else CHECK_EVERY_SECONDS

    return guarded
