"""The callbacks relay pass reads only the rows that owe a callback (issue 23): the timeline's status
lines and the revoked opt-ins, each through a partial index.

Built CONCURRENTLY: the timeline is the largest table and takes six or more lines per message, and a
plain CREATE INDEX would hold every accept and every send's result for as long as the build takes.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("messaging", "0013_message_callback_url"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="messageevent",
            index=models.Index(
                condition=models.Q(("kind__in", ("STATUS", "FAILED", "RESENT"))), fields=["id"], name="event_status_lines"
            ),
        ),
        AddIndexConcurrently(
            model_name="optin",
            index=models.Index(condition=models.Q(("revoked_at__isnull", False)), fields=["revoked_at"], name="optin_revoked"),
        ),
    ]
