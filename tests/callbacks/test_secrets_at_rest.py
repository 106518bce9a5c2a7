"""Endpoint signing secrets are encrypted at rest (issue 45 §6): the database holds a Fernet token under a key
kept outside it (ENDPOINT_SECRET_KEYS, else one derived from SECRET_KEY); the secret is shown once, at creation
and rotation, as before; `rotate_endpoint_secrets_key` re-encrypts every secret under the first key while the
old ones still decrypt (MultiFernet)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from callbacks import signing
from callbacks.models import WebhookEndpoint

URL = "http://127.0.0.1:9/hook"


def create(actor: Any) -> dict:
    response = actor.client().post("/v1/webhook-endpoints", {"url": URL, "eventTypes": ["message.status"]}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def stored_row(endpoint_id: str) -> str:
    """Every column of the endpoint's row as Postgres holds it, as text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT t::text FROM callbacks_webhookendpoint t WHERE id = %s", [endpoint_id])
        return str(cursor.fetchone()[0])


def test_the_database_never_holds_the_secret(alice: Any) -> None:
    created = create(alice)
    secret = created["secret"]
    assert secret.startswith("whsec_")
    row = stored_row(created["id"])
    assert secret not in row and "whsec_" not in row
    assert secret[len("whsec_"):] not in row
    assert WebhookEndpoint.objects.get(pk=created["id"]).secret == secret

    rotated = alice.client().post(f"/v1/webhook-endpoints/{created['id']}/rotate-secret").json()["secret"]
    assert rotated != secret and rotated.startswith("whsec_")
    assert rotated not in stored_row(created["id"])
    assert WebhookEndpoint.objects.get(pk=created["id"]).secret == rotated
    # Only the answers to create and rotate show it.
    assert "secret" not in alice.client().get(f"/v1/webhook-endpoints/{created['id']}").json()


def test_a_signature_still_verifies_with_the_secret_shown(alice: Any) -> None:
    from standardwebhooks.webhooks import Webhook

    created = create(alice)
    endpoint = WebhookEndpoint.objects.get(pk=created["id"])
    from django.utils import timezone

    body = '{"type":"message.status"}'
    headers = signing.headers(endpoint.secret, "msg_1", timezone.now(), body)
    Webhook(created["secret"]).verify(body, headers)


def rotate() -> dict:
    out = io.StringIO()
    call_command("rotate_endpoint_secrets_key", stdout=out)
    return json.loads(out.getvalue())


def rotate_failing() -> dict:
    """The command's answer when a secret cannot be read: its JSON on stdout, and a non-zero exit."""
    from django.core.management import CommandError

    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("rotate_endpoint_secrets_key", stdout=out)
    return json.loads(out.getvalue())


def test_the_key_rotates_and_the_old_key_is_accepted_meanwhile(alice: Any, settings: Any) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.ENDPOINT_SECRET_KEYS = [old]
    secrets = [create(alice)["secret"] for _ in range(3)]
    before = {pk: stored_row(pk) for pk in WebhookEndpoint.objects.values_list("pk", flat=True)}

    # The new key first, the old one still listed: every secret reads, old and new alike.
    settings.ENDPOINT_SECRET_KEYS = [new, old]
    assert sorted(e.secret for e in WebhookEndpoint.objects.all()) == sorted(secrets)
    assert rotate() == {"rotated": 3, "unreadable": []}
    assert all(stored_row(pk) != row for pk, row in before.items())

    # The old key dropped: every secret still reads, under the new key alone.
    settings.ENDPOINT_SECRET_KEYS = [new]
    assert sorted(e.secret for e in WebhookEndpoint.objects.all()) == sorted(secrets)
    assert rotate() == {"rotated": 3, "unreadable": []}  # running it again changes nothing it cannot read


def test_a_secret_no_key_reads_is_named_and_left_alone(alice: Any, settings: Any) -> None:
    settings.ENDPOINT_SECRET_KEYS = [Fernet.generate_key().decode()]
    endpoint_id = create(alice)["id"]
    row = stored_row(endpoint_id)
    settings.ENDPOINT_SECRET_KEYS = [Fernet.generate_key().decode()]  # the old key lost
    assert rotate_failing() == {"rotated": 0, "unreadable": [endpoint_id]}
    assert stored_row(endpoint_id) == row


def test_the_migration_encrypts_the_secrets_stored_before(transactional_db: Any, alice: Any) -> None:
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("callbacks", "0003_endpoint_environment")])
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO callbacks_webhookendpoint (id, project_id, environment, url, description, event_types,"
                " secret, per_message, enabled, disabled_reason, circuit_state, circuit_failures, created_at,"
                " updated_at) VALUES ('6f1c0c6e-8f4e-4a53-9a54-2f8a3f0e0001', %s, 'LIVE', %s, '',"
                " ARRAY['message.status'], 'whsec_MfKQ9r6Y4Xr1wXQ2sZg0qk7Y2m9d3hQe', false, true, '', 'closed', 0,"
                " now(), now())",
                [alice.project.pk, URL],
            )
        executor = MigrationExecutor(connection)
        executor.migrate([("callbacks", "0004_secrets_at_rest")])
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    endpoint = WebhookEndpoint.objects.get(pk="6f1c0c6e-8f4e-4a53-9a54-2f8a3f0e0001")
    assert endpoint.secret == "whsec_MfKQ9r6Y4Xr1wXQ2sZg0qk7Y2m9d3hQe"
    assert "whsec_" not in stored_row(str(endpoint.pk))


@pytest.mark.parametrize("value", ["not-a-key", "c2hvcnQ="])
def test_a_malformed_key_stops_start_up_naming_the_variable(value: str) -> None:
    import os
    import subprocess
    import sys

    from tests.support.processes import ROOT

    env = {**os.environ, "ENDPOINT_SECRET_KEYS": f"{Fernet.generate_key().decode()},{value}"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "ENDPOINT_SECRET_KEYS" in result.stderr
