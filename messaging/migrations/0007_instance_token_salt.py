"""Every instance gets its own random webhook token salt (issue 21).

Instances made in admin had an empty salt, so their webhook token followed from SECRET_KEY and
the name alone. This gives each of them a random salt, which CHANGES THEIR WEBHOOK TOKEN: the
migration names them, and the operator re-registers each one's webhook with Evolution
(`python3 manage.py webhook_token --name <name>` prints the new token). Instances that already had
a salt keep their token.
"""

import secrets
import sys

from django.db import migrations, models

import messaging.models


def salt_unsalted_instances(apps, schema_editor):
    Instance = apps.get_model("messaging", "Instance")
    changed = []
    for pk, name in Instance.objects.filter(token_salt="").values_list("pk", "name"):
        Instance.objects.filter(pk=pk).update(token_salt=secrets.token_hex(16))
        changed.append(name)
    if changed:
        sys.stdout.write(
            f"\n  messaging 0007: {len(changed)} instance(s) had no webhook token salt and got a random one, "
            f"so their webhook token changed: {', '.join(sorted(changed))}. Re-register each one's webhook "
            "token with Evolution: python3 manage.py webhook_token --name <name>\n"
        )


class Migration(migrations.Migration):

    dependencies = [
        ("messaging", "0006_status_sync_holds_retention"),
    ]

    operations = [
        migrations.RunPython(salt_unsalted_instances, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="instance",
            name="token_salt",
            field=models.CharField(default=messaging.models.new_token_salt, max_length=32),
        ),
        migrations.AddConstraint(
            model_name="instance",
            constraint=models.CheckConstraint(
                condition=models.Q(("token_salt", ""), _negated=True), name="instance_token_salt_set"
            ),
        ),
    ]
