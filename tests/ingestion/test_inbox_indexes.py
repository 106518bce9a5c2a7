"""The inbox's indexes: every event inserts a row, so each index is paid for on every event."""

from __future__ import annotations

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def inbox_indexes() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'evolution_ingestion_events'"
        )
        return dict(cursor.fetchall())


def test_the_dedup_key_has_its_unique_index_and_no_like_index(db):
    indexes = inbox_indexes()
    assert "evolution_ingestion_events_dedup_key_key" in indexes
    assert "UNIQUE" in indexes["evolution_ingestion_events_dedup_key_key"]
    assert not [name for name, definition in indexes.items() if "varchar_pattern_ops" in definition]


def test_the_migration_drops_only_the_like_index_and_can_be_reversed(transactional_db):
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("ingestion", "0002_occurred_at")])
        before = inbox_indexes()
        assert [name for name, definition in before.items() if "varchar_pattern_ops" in definition]

        executor = MigrationExecutor(connection)
        executor.migrate([("ingestion", "0003_dedup_key_without_like_index")])
        after = inbox_indexes()
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    dropped = set(before) - set(after)
    assert len(dropped) == 1 and "varchar_pattern_ops" in before[dropped.pop()]
    assert set(after) <= set(before)
