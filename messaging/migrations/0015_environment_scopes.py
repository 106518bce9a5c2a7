"""The environment is part of every scope (issue 45 §1, docs/security.md "The sandbox rule").

- Consents get the environment of the key that recorded them: a row whose `created_by` is a TEST key's
  prefix (`ps_test_…`) becomes TEST, every other one (a LIVE key, admin, an operator) LIVE. A consent a
  TEST key recorded no longer lets a LIVE send through: a TEST key must not cause a live effect.
- Idempotency answers get their message's environment (the answer's `id`); the others, LIVE.
- GET /v1/messages and the dashboard read one environment's messages: msg_project_created gains the
  environment after the project (the same name, so one index replaces the other).
"""

from django.db import migrations, models

CONSENTS_BY_RECORDER = """
    UPDATE messaging_optin SET environment = 'TEST' WHERE created_by LIKE 'ps\\_test\\_%'
"""
ANSWERS_BY_MESSAGE = """
    UPDATE messaging_idempotencyrecord r SET environment = m.environment
    FROM messaging_message m WHERE m.id::text = r.response->>'id' AND m.project_id = r.project_id
"""


class Migration(migrations.Migration):

    dependencies = [
        ('messaging', '0014_status_lines_and_revocations_indexes'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='idempotencyrecord',
            name='one_answer_per_key',
        ),
        migrations.RemoveConstraint(
            model_name='optin',
            name='one_live_opt_in_per_phone',
        ),
        migrations.RemoveIndex(
            model_name='message',
            name='msg_project_created',
        ),
        migrations.AddField(
            model_name='idempotencyrecord',
            name='environment',
            field=models.CharField(choices=[('TEST', 'Test'), ('LIVE', 'Live')], default='LIVE', max_length=4),
        ),
        migrations.AddField(
            model_name='optin',
            name='environment',
            field=models.CharField(choices=[('TEST', 'Test'), ('LIVE', 'Live')], default='LIVE', max_length=4),
        ),
        migrations.RunSQL(CONSENTS_BY_RECORDER, migrations.RunSQL.noop),
        migrations.RunSQL(ANSWERS_BY_MESSAGE, migrations.RunSQL.noop),
        migrations.AddIndex(
            model_name='message',
            index=models.Index(fields=['project', 'environment', '-created_at'], name='msg_project_created'),
        ),
        migrations.AddConstraint(
            model_name='idempotencyrecord',
            constraint=models.UniqueConstraint(fields=('project', 'environment', 'key'), name='one_answer_per_key'),
        ),
        migrations.AddConstraint(
            model_name='optin',
            constraint=models.UniqueConstraint(condition=models.Q(('revoked_at__isnull', True)), fields=('project', 'environment', 'phone'), name='one_live_opt_in_per_phone'),
        ),
    ]
