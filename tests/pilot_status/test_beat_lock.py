"""One beat per database (pilot_status.beat_lock, docs/scaling.md): the real `celery beat` as the Procfile
starts it, twice on one database. The second exits with status 3 and says who holds the lock; the first
goes on; once the first is SIGKILLed, a new beat takes over."""

from __future__ import annotations

import io
import os
import sys
import time
from typing import Any

import psycopg
import pytest

from pilot_status import beat_lock
from tests.support import processes
from tests.support.processes import Process, wait_for_log


def beat(name: str) -> Process:
    env = {**os.environ, "DATABASE_URL": processes.test_database_url(), "PYTHONUNBUFFERED": "1",
           # Ticks far apart: this test is about who may tick, not about the maintenance itself.
           "RECONCILE_SECONDS": "3600", "STATUS_SYNC_SECONDS": "3600", "INSTANCE_POLL_SECONDS": "3600",
           "INGESTION_RECONCILE_SECONDS": "3600", "RETENTION_SECONDS": "3600"}
    argv = [sys.executable, "-m", "celery", "-A", "pilot_status", "beat", "-l", "info",
            "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler"]
    return Process(name, argv, env)


def lock_holder_pid() -> int | None:
    params = beat_lock.connection_params()
    with psycopg.connect(autocommit=True, **params) as conn:
        row = conn.execute(
            "SELECT a.application_name, l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = %s "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [beat_lock.LOCK_KEY]).fetchone()
    return None if row is None else int(row[1])


def wait_for_holder(other_than: int | None = None, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = lock_holder_pid()
        if pid is not None and pid != other_than:
            return pid
        time.sleep(0.2)
    raise AssertionError("no beat took the lock")


@pytest.mark.stack
@pytest.mark.timeout(240)
def test_a_second_beat_on_the_same_database_exits_and_a_new_one_takes_over_a_killed_one(transactional_db: Any) -> None:
    first, second, third = beat("beat-lock-first"), beat("beat-lock-second"), beat("beat-lock-third")
    for p in (first, second, third):
        p.log.unlink(missing_ok=True)
    try:
        first.start()
        held_by = wait_for_holder()
        wait_for_log(first.log, "beat lock: held", proc=first.proc, timeout=60)

        second.start()
        assert second.proc is not None
        assert second.proc.wait(timeout=120) == beat_lock.LOCKED_EXIT
        refused = second.log.read_text()
        assert "another beat already runs on database" in refused and "beat lock on" in refused
        assert "beat: Starting" in refused and "beat lock: held" not in refused
        assert first.alive() and lock_holder_pid() == held_by

        first.kill()  # SIGKILL: no clean shutdown, Postgres drops the lock with the connection
        third.start()
        wait_for_holder(other_than=held_by)
        wait_for_log(third.log, "beat lock: held", proc=third.proc, timeout=60)
        assert third.alive()
    finally:
        for p in (first, second, third):
            p.stop()


def test_the_lock_is_one_per_database_and_free_again_once_its_session_ends(transactional_db: Any) -> None:
    mine, other = beat_lock.BeatLock(beat_lock.connection_params()), beat_lock.BeatLock(beat_lock.connection_params())
    try:
        assert mine.acquire()
        assert not other.acquire()
        assert "beat lock on" in other.holder()
        with pytest.raises(beat_lock.AnotherBeatRuns):
            other.confirmed()
        mine.close()
        # The lock goes with the session, which ends when its backend exits: a moment after the client has closed
        # its connection, longer on a busy machine.
        deadline = time.monotonic() + 5
        while not other.acquire() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.conn is not None
    finally:
        mine.close()
        other.close()


def test_a_beat_that_lost_its_connection_sends_nothing_and_stops_if_another_took_the_lock(transactional_db: Any) -> None:
    mine, other = beat_lock.BeatLock(beat_lock.connection_params()), beat_lock.BeatLock(beat_lock.connection_params())
    ticks: list[int] = []
    err = io.StringIO()
    tick = beat_lock.guarded_tick(lambda: ticks.append(1) or 5.0, mine, "db", err)
    try:
        assert mine.acquire()
        assert tick() == 5.0 and ticks == [1]
        assert mine.conn is not None
        # Postgres ends the lock's session (as a restart or a dropped link would): the lock goes with it.
        with psycopg.connect(autocommit=True, **beat_lock.connection_params()) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [mine.conn.info.backend_pid])
        assert other.acquire()
        mine.checked_at = 0.0
        with pytest.raises(SystemExit) as stopped:
            tick()
        assert stopped.value.code == beat_lock.LOCKED_EXIT
        assert ticks == [1] and "another beat already runs" in err.getvalue()
    finally:
        mine.close()
        other.close()


def test_a_beat_whose_connection_dropped_takes_the_lock_again_when_nobody_else_has(transactional_db: Any) -> None:
    mine = beat_lock.BeatLock(beat_lock.connection_params())
    ticks: list[int] = []
    tick = beat_lock.guarded_tick(lambda: ticks.append(1) or 5.0, mine, "db", io.StringIO())
    try:
        assert mine.acquire() and mine.conn is not None
        lost = mine.conn.info.backend_pid
        with psycopg.connect(autocommit=True, **beat_lock.connection_params()) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [lost])
        mine.checked_at = 0.0
        assert tick() == 5.0 and ticks == [1]
        assert lock_holder_pid() not in (None, lost)
    finally:
        mine.close()


def test_a_beat_started_while_postgres_is_away_ticks_only_once_it_holds_the_lock(transactional_db: Any) -> None:
    from types import SimpleNamespace

    ticks: list[int] = []
    service = SimpleNamespace(scheduler=SimpleNamespace(tick=lambda: ticks.append(1) or 5.0))
    reachable = beat_lock.connection_params()
    lock = beat_lock.BeatLock({**reachable, "host": "127.0.0.1", "port": processes.free_port(), "connect_timeout": 1})
    try:
        beat_lock.hold_or_exit(service, lock=lock, err=io.StringIO())
        assert service.scheduler.tick() == beat_lock.CHECK_EVERY_SECONDS and ticks == []
        lock.params = reachable  # Postgres is back
        assert service.scheduler.tick() == 5.0 and ticks == [1]
        assert lock_holder_pid() is not None
    finally:
        lock.close()
