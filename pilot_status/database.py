"""A request's first unit of work doubles as its connection health check (one round trip less).

CONN_HEALTH_CHECKS sends a `SELECT 1` before the first statement of every request on a pooled
connection, so that a connection Postgres dropped (a restart) is replaced instead of failing the
request. Ingesting an event is one transaction that can simply run again: when it fails and the
connection turns out unusable, the connection is replaced and the work runs once more, as the
health check would have arranged. A retry after an uncertain COMMIT is harmless too: the inbox's
unique key and processed_at make the second run find the event stored (and processed, if the
first commit went through). A database that is really down still fails (the view answers 503).
The accept path's first read and a lane worker's claim use it the same way (messaging/accept.py,
messaging/sending/worker.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

T = TypeVar("T")


def checking_connection(work: Callable[[], T]) -> T:
    db: Any = connections[DEFAULT_DB_ALIAS]  # health_check_* are not in django-stubs
    checking = (
        db.connection is not None and db.health_check_enabled and not db.health_check_done
        and not db.in_atomic_block
    )
    if checking:
        db.health_check_done = True
    pooled = db.connection
    try:
        return work()
    except DatabaseError:
        if not checking:
            raise
        # Leaving the failed transaction, Django may already have dropped the dead connection
        # and opened a new one; otherwise the old one is asked, as the health check would.
        if db.connection is pooled and db.is_usable():
            raise  # the connection is fine: a genuine error
    if db.connection is pooled:
        db.close()
    return work()


def delete_in_batches(statement: str, params: dict[str, Any], batch: int, budget_s: float) -> int:
    """Run a DELETE that takes at most %(batch)s rows per statement (each committing on its own)
    until one deletes fewer than `batch` or `budget_s` is spent; how many rows went (retention)."""
    started = time.monotonic()
    deleted = 0
    while True:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute(statement, {**params, "batch": batch})
            count = int(cursor.rowcount)
        deleted += count
        if count < batch or time.monotonic() - started > budget_s:
            return deleted


def release_while_waiting() -> None:
    """About to wait on something slow (Evolution): give this thread's connection back to the process's
    pool, so that a lane worker's connections are bounded by its pool, not by its threads (issue 26).
    The next statement takes one again. Without a pool (every process but the threaded lane workers)
    the connection stays, as it always did; inside a transaction nothing is released."""
    db: Any = connections[DEFAULT_DB_ALIAS]
    if db.connection is not None and not db.in_atomic_block and db.pool is not None:
        db.close()
