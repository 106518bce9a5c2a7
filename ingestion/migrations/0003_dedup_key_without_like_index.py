"""The inbox's dedup key keeps its unique index and loses the varchar_pattern_ops (LIKE) index that
Django adds for unique=True on Postgres: nothing searches dedup keys by prefix, and every event
paid for maintaining it. The unique constraint itself is untouched (same name, now declared in
Meta), so this is one DROP INDEX and no rewrite."""

from django.db import migrations, models

_DROP_LIKE_INDEXES = """
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT indexname FROM pg_indexes
              WHERE schemaname = current_schema() AND tablename = 'evolution_ingestion_events'
                AND indexdef LIKE '%(dedup_key varchar_pattern_ops)%'
    LOOP
        EXECUTE 'DROP INDEX IF EXISTS ' || quote_ident(r.indexname);
    END LOOP;
END $$;
"""
_RECREATE_LIKE_INDEX = (
    "CREATE INDEX IF NOT EXISTS evolution_ingestion_events_dedup_key_7e800919_like "
    "ON evolution_ingestion_events (dedup_key varchar_pattern_ops)"
)


class Migration(migrations.Migration):
    dependencies = [("ingestion", "0002_occurred_at")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="ingestionevent", name="dedup_key", field=models.CharField(max_length=64)
                ),
                migrations.AddConstraint(
                    model_name="ingestionevent",
                    constraint=models.UniqueConstraint(
                        fields=("dedup_key",), name="evolution_ingestion_events_dedup_key_key"
                    ),
                ),
            ],
            database_operations=[migrations.RunSQL(_DROP_LIKE_INDEXES, reverse_sql=_RECREATE_LIKE_INDEX)],
        ),
    ]
