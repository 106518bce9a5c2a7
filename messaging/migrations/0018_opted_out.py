"""Consent at send time (issue 47 §5): the failure reason OPTED_OUT, and the two partial indexes an opt-out
reads through: the queued messages to its number, and every project's live consent for it (a shared instance).

Built CONCURRENTLY: the messages table is large and busy, and a plain CREATE INDEX would hold every accept and
every send's result for as long as the build takes.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

REASONS = [
    ("INSTANCE_NOT_FOUND", "Instance not found on Evolution"),
    ("INVALID_RECIPIENT", "Number is not on WhatsApp"),
    ("RETRIES_EXHAUSTED", "Retries exhausted"),
    ("EXPIRED", "deliverUntil passed before a send succeeded"),
    ("REJECTED", "Rejected by WhatsApp"),
    ("OUTCOME_UNKNOWN", "May have been delivered: the outcome of a send is unknown"),
    ("NO_WARM_INSTANCE", "No instance could reach this cold contact in time"),
    ("OPTED_OUT", "The recipient opted out before it was sent"),
]


class Migration(migrations.Migration):

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("messaging", "0017_sendschedule_without_waiting_reason"),
    ]

    operations = [
        migrations.AlterField(
            model_name="deadletter",
            name="reason",
            field=models.CharField(choices=REASONS, max_length=20),
        ),
        migrations.AlterField(
            model_name="message",
            name="failure_reason",
            field=models.CharField(blank=True, choices=REASONS, default="", max_length=20),
        ),
        AddIndexConcurrently(
            model_name="message",
            index=models.Index(condition=models.Q(("status", "QUEUED")), fields=["to"], name="msg_queued_to"),
        ),
        AddIndexConcurrently(
            model_name="optin",
            index=models.Index(condition=models.Q(("revoked_at__isnull", True)), fields=["phone"], name="optin_live_phone"),
        ),
    ]
