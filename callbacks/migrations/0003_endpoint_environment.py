"""Endpoints belong to an environment (issue 45 §1): one made with a TEST key receives TEST events only.

Every endpoint made before is LIVE. Which key made it was never recorded, and until now each one received
the events of both environments: as LIVE it keeps every event a production receiver relies on, and only
loses the TEST ones (a receiver meant for tests is made again with the TEST key). A project may now have
one per-message endpoint per environment.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('callbacks', '0002_drop_duplicate_optin_revoked_index'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='webhookendpoint',
            name='one_per_message_endpoint',
        ),
        migrations.RemoveIndex(
            model_name='webhookendpoint',
            name='endpoint_by_project',
        ),
        migrations.AddField(
            model_name='webhookendpoint',
            name='environment',
            field=models.CharField(choices=[('TEST', 'Test'), ('LIVE', 'Live')], default='LIVE', max_length=4),
        ),
        migrations.AddIndex(
            model_name='webhookendpoint',
            index=models.Index(fields=['project', 'environment', 'created_at'], name='endpoint_by_project'),
        ),
        migrations.AddConstraint(
            model_name='webhookendpoint',
            constraint=models.UniqueConstraint(condition=models.Q(('per_message', True)), fields=('project', 'environment'), name='one_per_message_endpoint'),
        ),
    ]
