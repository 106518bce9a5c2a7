"""Prepared statements for the hot paths: the same few statements on every message.

Once prepared on a connection, Postgres no longer parses and plans them each time, which is a large
share of its CPU per accepted message (bench/findings.md, "Prepared statements"). Only the statements that run once or
more per message use this (accepting, claiming, a send's result, a receipt, a webhook's instance
credentials); the rest of the project keeps Django's defaults (client-side binding, no prepared
statements). Needs `prepare_threshold` in the database OPTIONS so that a cursor may ask
(settings.DATABASES).

Why this module and not Django's own switch (issue 25): Django exposes psycopg's preparation only
as OPTIONS "server_side_binding": True plus "prepare_threshold", which moves every query of every
process to server-side binding. Django's own backend says the ORM does not generate SQL that is
always preparable (its ServerSideCursor comment, ticket #20516), and this project's raw SQL has
statements that a server-bound parameter breaks (pilot_status.status: `SET LOCAL statement_timeout
= %s`). Here only the hand-picked statements are bound server-side and prepared, through psycopg's
public Cursor and its execute(prepare=True); the rest is Django's connection handling unchanged.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections


class _PreparedCursor(psycopg.Cursor[Any]):
    """Server-side parameters, and the statement prepared on its first use on a connection."""

    reusable = False  # the connection's kept cursor (_cursor_for)
    in_use = False

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None) -> Any:
        return super().execute(query, params, prepare=True, binary=binary)

    def close(self) -> None:
        if self.reusable:
            self.in_use = False  # kept open for the connection's next statement
            return
        super().close()


def _cursor_for(db: Any) -> _PreparedCursor:
    """The connection's kept cursor, or a new one while that one is in use.

    A cursor sets up psycopg's adapters again for every type it sends (Python code per new
    cursor); keeping one per connection spares that on every statement (bench/findings.md, "Prepared
    statements"). It is dropped with its connection: a reconnect makes a new one.
    """
    kept = getattr(db, "_ps_prepared_cursor", None)
    if kept is not None and kept[0] is db.connection and not kept[1].in_use and not kept[1].closed:
        cursor: _PreparedCursor = kept[1]
    else:
        with db.wrap_database_errors:
            cursor = _PreparedCursor(db.connection)
        if kept is None or kept[0] is not db.connection or kept[1].closed:
            cursor.reusable = True
            db._ps_prepared_cursor = (db.connection, cursor)
    cursor.in_use = True
    return cursor


def prepared_cursor() -> Any:
    """A Django cursor (health check, error wrapping, query logging) over a _PreparedCursor.

    Use it in a `with` block and read its rows inside: leaving the block hands the kept cursor
    back (a cursor opened meanwhile, nested, is a new one)."""
    db: Any = connections[DEFAULT_DB_ALIAS]  # make_cursor() is typed for a CursorWrapper in django-stubs
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    raw = _cursor_for(db)
    return db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)
