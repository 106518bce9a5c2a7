"""A bulk resend job belongs to the dashboard mode it was started in (issue 45 §1); jobs made before, LIVE."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='bulkresendjob',
            name='environment',
            field=models.CharField(choices=[('TEST', 'Test'), ('LIVE', 'Live')], default='LIVE', max_length=4),
        ),
    ]
