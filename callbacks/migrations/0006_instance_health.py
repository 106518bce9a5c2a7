"""The event type instance.health (issue 47 §3): choices only, nothing changes in the database."""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('callbacks', '0005_unacknowledged'),
    ]

    operations = [
        migrations.AlterField(
            model_name='delivery',
            name='event_type',
            field=models.CharField(choices=[('message.status', "A message's status changed"), ('message.inbound', "A message arrived on one of the project's instances"), ('opt_in.revoked', "A recipient's opt-in was revoked"), ('message.unacknowledged', 'A message was sent and WhatsApp never acknowledged it'), ('instance.health', "The health state of one of the project's instances changed")], max_length=32),
        ),
        migrations.AlterField(
            model_name='webhookendpoint',
            name='event_types',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(choices=[('message.status', "A message's status changed"), ('message.inbound', "A message arrived on one of the project's instances"), ('opt_in.revoked', "A recipient's opt-in was revoked"), ('message.unacknowledged', 'A message was sent and WhatsApp never acknowledged it'), ('instance.health', "The health state of one of the project's instances changed")], max_length=32), size=None),
        ),
    ]
