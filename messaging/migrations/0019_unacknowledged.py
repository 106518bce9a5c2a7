"""Sends WhatsApp never acknowledged (issue 47 §6): when the status sync pass flagged one, its timeline line, and
the partial index of the flagged SENT messages (built CONCURRENTLY: the messages table is large and busy). The new
column is nullable without a default: adding it rewrites nothing."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ('messaging', '0018_opted_out'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='unacknowledged_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='messageevent',
            name='kind',
            field=models.CharField(choices=[('ACCEPTED', 'Accepted'), ('DISPATCHED', 'Released to its lane'), ('ATTEMPT', 'Send attempt'), ('WAITING', 'Waiting (no attempt used)'), ('REROUTED', 'Re-routed to another instance'), ('STATUS', 'Status change'), ('FAILED', 'Failed'), ('DEAD_LETTERED', 'Dead-lettered'), ('RESENT', 'Force resend'), ('DISMISSED', 'Dismissed'), ('RECOVERED', 'Recovered by a reconciler'), ('SYNC_STOPPED', 'Status checks stopped'), ('CHECKED', 'Lost answer checked with Evolution'), ('UNACKNOWLEDGED', 'Sent, never acknowledged by WhatsApp')], max_length=16),
        ),
        AddIndexConcurrently(
            model_name='message',
            index=models.Index(condition=models.Q(('status', 'SENT'), ('unacknowledged_at__isnull', False)), fields=['instance', 'sent_at'], name='msg_unacknowledged'),
        ),
    ]
