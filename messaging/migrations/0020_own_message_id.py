"""Every send carries a WhatsApp id we choose (issue 48): the message keeps it (`own_message_id`, unique when set),
and the instance whether its Evolution sends with it (`honours_message_id`, unknown until an answer shows it).
Existing messages have none: their lost answers are judged as before (sending.evidence)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('messaging', '0019_unacknowledged'),
    ]

    operations = [
        migrations.AddField(
            model_name='instance',
            name='honours_message_id',
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='message',
            name='own_message_id',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddConstraint(
            model_name='message',
            constraint=models.UniqueConstraint(condition=models.Q(('own_message_id', ''), _negated=True), fields=('own_message_id',), name='msg_own_id_once'),
        ),
    ]
