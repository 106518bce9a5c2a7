"""Prepared statements for the hot paths: the same few statements on every message.

Once prepared on a connection, Postgres no longer parses and plans them each time (about half of
Postgres' CPU per accepted message, measured in issue 7). Only the statements that run once or
more per message use this (accepting, claiming, a send's result, a receipt); the rest of the
project keeps Django's defaults (client-side binding, no prepared statements). Needs
`prepare_threshold` in the database OPTIONS so that a cursor may ask (settings.DATABASES).
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]  # not in django-stubs


class _PreparedCursor(ServerBindingCursor):  # type: ignore[misc]
    """Server-side parameters, and the statement prepared on its first use on a connection."""

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None) -> Any:
        return super().execute(query, params, prepare=True, binary=binary)


def prepared_cursor() -> Any:
    """A Django cursor (health check, error wrapping, query logging) over a _PreparedCursor."""
    db = connections[DEFAULT_DB_ALIAS]
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    with db.wrap_database_errors:
        raw = _PreparedCursor(db.connection)
    return db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)
