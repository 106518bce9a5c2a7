"""The callbacks relay pass reads only the inbox's messages.upsert rows (issue 23), through a partial
index; built CONCURRENTLY so that ingestion keeps writing meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("ingestion", "0006_strip_credentials_at_rest"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="ingestionevent",
            index=models.Index(condition=models.Q(("event", "messages.upsert")), fields=["id"], name="ingest_upserts"),
        ),
    ]
