"""Endpoint signing secrets are stored encrypted (issue 45 §6, callbacks.secret_storage).

Each existing secret is encrypted under the first key configured when this runs (ENDPOINT_SECRET_KEYS, else
the one derived from SECRET_KEY), and the plain column is dropped. Going back decrypts them into it again.
"""

from django.db import migrations, models

import callbacks.models


def encrypt_existing(apps, schema_editor):
    from callbacks import secret_storage

    WebhookEndpoint = apps.get_model("callbacks", "WebhookEndpoint")
    for endpoint in WebhookEndpoint.objects.only("pk", "secret").iterator(chunk_size=500):
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(encrypted_secret=secret_storage.encrypt(endpoint.secret))


def decrypt_existing(apps, schema_editor):
    from callbacks import secret_storage

    WebhookEndpoint = apps.get_model("callbacks", "WebhookEndpoint")
    for endpoint in WebhookEndpoint.objects.only("pk", "encrypted_secret").iterator(chunk_size=500):
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret=secret_storage.decrypt(endpoint.encrypted_secret))


class Migration(migrations.Migration):

    dependencies = [
        ('callbacks', '0003_endpoint_environment'),
    ]

    operations = [
        migrations.AddField(
            model_name='webhookendpoint',
            name='encrypted_secret',
            field=models.TextField(default=''),
            preserve_default=False,
        ),
        migrations.RunPython(encrypt_existing, decrypt_existing),
        migrations.RemoveField(
            model_name='webhookendpoint',
            name='secret',
        ),
        migrations.AlterField(
            model_name='webhookendpoint',
            name='encrypted_secret',
            field=models.TextField(default=callbacks.models.new_encrypted_secret),
        ),
    ]
