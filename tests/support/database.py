"""Emptying tables while a running stack may still hold locks on them (bench and chaos harnesses)."""

from __future__ import annotations

import time
from collections.abc import Iterable


def truncate_with_retry(tables: Iterable[str], tries: int = 10, lock_timeout: str = "3s") -> None:
    """TRUNCATE `tables`; a worker or the relay may still hold row locks, so wait briefly and retry.

    A lost connection (Postgres restarted under us) is closed so the next try gets a fresh one.
    A `lock_timeout` under Postgres' deadlock_timeout (1 s) makes the TRUNCATE give up first when it
    meets transactions still running, instead of Postgres picking one of them as a deadlock victim.
    """
    from django.db import OperationalError, connection, transaction

    statement = f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"
    for attempt in range(tries):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [lock_timeout])
                cursor.execute(statement)
            return
        except OperationalError as exc:
            if attempt == tries - 1:
                raise OperationalError(f"{exc}; sessions on those tables then: {_holders(tables)}") from exc
            connection.close()
            time.sleep(0.5)


def _holders(tables: Iterable[str]) -> list[tuple[object, ...]]:
    """Who held a lock on `tables` (pid, state, since when, what it runs): what a TRUNCATE that ran out of tries waited
    for, so that the harness's error names it."""
    from django.db import connection

    connection.close()
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                """SELECT DISTINCT a.pid, a.application_name, a.state, a.xact_start, left(a.query, 200)
                     FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                    WHERE l.relation = ANY(%s::regclass[]) AND a.pid <> pg_backend_pid()""",
                [list(tables)])
            return list(cursor.fetchall())
    except Exception as exc:  # the diagnosis must not hide the error it explains
        return [("unreadable", repr(exc))]
