"""Strip credentials from inbox payloads stored before the inbox stopped keeping them (issue 21).

Evolution puts the instance token in the envelope's `apikey`; until now the raw payload kept it, and
admin showed it. The same envelope fields `ingestion.inbox.CREDENTIAL_FIELDS` names (copied here: a
migration does not follow later code) are removed from every row, top level only: none is part of an
event's identity, so `dedup_key` stays valid for both channels. In batches of BATCH rows by id, each
its own short transaction (the migration is not atomic), so a large inbox is never locked at once
and an interrupted run resumes where it stopped when run again.
"""

from typing import Any

from django.db import connections, migrations

BATCH = 5_000
FIELDS = ["apikey", "token", "hash", "jwt_key", "wavoipToken", "accessTokenWaBusiness"]

_STRIP_BATCH = """
WITH batch AS (
    SELECT id FROM evolution_ingestion_events WHERE id > %(after)s ORDER BY id LIMIT %(size)s
), stripped AS (
    UPDATE evolution_ingestion_events e
       SET payload = e.payload - %(fields)s::text[]
      FROM batch
     WHERE e.id = batch.id AND jsonb_typeof(e.payload) = 'object' AND e.payload ?| %(fields)s::text[]
    RETURNING e.id
)
SELECT (SELECT max(id) FROM batch), (SELECT count(*) FROM stripped)
"""


def strip_credentials(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection if schema_editor is not None else connections["default"]
    after = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(_STRIP_BATCH, {"after": after, "size": BATCH, "fields": FIELDS})
            last, _ = cursor.fetchone()
        if last is None:
            return
        after = last


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("ingestion", "0005_unprocessed_by_attempts")]

    operations = [migrations.RunPython(strip_credentials, migrations.RunPython.noop, elidable=True)]
