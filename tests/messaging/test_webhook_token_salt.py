"""Webhook tokens use a per-instance random salt (issue 21): however an instance is made (operator
command, admin, a script), its token does not follow from SECRET_KEY and its name alone; instances
made before with an empty salt get one by migration, and the operator can print the new token."""

from __future__ import annotations

import contextlib
import io
import json
import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from messaging import operators
from messaging.models import Instance
from messaging.tokens import _derived_webhook_token

SALT = re.compile(r"^[0-9a-f]{32}$")


def unsalted_token(name: str) -> str:
    from django.conf import settings

    return _derived_webhook_token(settings.SECRET_KEY, name, "")


def test_add_instance_draws_a_random_salt(db):
    first = operators.add_instance("shop-1")
    second = operators.add_instance("shop-2")
    salts = set(Instance.objects.values_list("token_salt", flat=True))
    assert len(salts) == 2 and all(SALT.match(salt) for salt in salts)
    assert first["webhook_token"] != unsalted_token("shop-1")
    assert Instance.objects.get(name="shop-1").check_webhook_token(first["webhook_token"])
    assert first["webhook_token"] != second["webhook_token"]


def test_the_same_name_made_again_gets_another_token(db):
    # Another deployment (or a re-created instance) with the same key and name: another token.
    before = operators.add_instance("shop-1")["webhook_token"]
    Instance.objects.filter(name="shop-1").delete()
    assert operators.add_instance("shop-1")["webhook_token"] != before


def test_an_instance_made_in_admin_gets_a_salt(admin_client):
    response = admin_client.post("/admin/messaging/instance/add/", {
        "name": "admin-made", "priority": "100", "connection_state": "open",
        "created_at_0": "2026-12-01", "created_at_1": "10:00:00",
        "send_profile": "unofficial", "health_state": "healthy", "send_policy": "",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    instance = Instance.objects.get(name="admin-made")
    assert SALT.match(instance.token_salt)
    assert not instance.check_webhook_token(unsalted_token("admin-made"))


def test_an_explicit_empty_salt_is_replaced_and_the_database_refuses_one(db):
    instance = Instance.objects.create(name="scripted", token_salt="")
    assert SALT.match(instance.token_salt)
    assert SALT.match(Instance.objects.get(pk=instance.pk).token_salt)
    with pytest.raises(IntegrityError), transaction.atomic():
        Instance.objects.filter(pk=instance.pk).update(token_salt="")


@pytest.mark.parametrize("candidate", ["", "wrong", "t\u00f6ken", "\ud800", "\x00" * 64])
def test_a_wrong_token_is_refused_without_raising(db, candidate):
    instance = Instance.objects.get(pk=operators.add_instance("shop-1")["instance_id"])
    assert instance.check_webhook_token(candidate) is False
    assert instance.check_webhook_token(instance.webhook_token) is True


def run(*args: str) -> dict:
    out = StringIO()
    call_command(*args, stdout=out)
    return json.loads(out.getvalue())


def test_webhook_token_prints_the_token_and_rotates_it(db):
    made = operators.add_instance("shop-1")
    shown = run("webhook_token", "--name", "shop-1")
    assert shown["webhook_token"] == made["webhook_token"]
    rotated = run("webhook_token", "--name", "shop-1", "--rotate")
    instance = Instance.objects.get(name="shop-1")
    assert rotated["webhook_token"] != made["webhook_token"]
    assert instance.check_webhook_token(rotated["webhook_token"])
    assert not instance.check_webhook_token(made["webhook_token"])


def test_webhook_token_names_an_unknown_instance(db):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="nope"):
        run("webhook_token", "--name", "nope")


def test_the_migration_salts_every_unsalted_instance_and_names_it(transactional_db):
    salted = Instance.objects.get(pk=operators.add_instance("already-salted")["instance_id"])
    executor = MigrationExecutor(connection)
    out = io.StringIO()
    try:
        executor.migrate([("messaging", "0006_status_sync_holds_retention")])
        # What admin used to make: an instance with an empty salt (no constraint before 0007).
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO messaging_instance (name, is_official, priority, connection_state, state_changed_at,"
                " token_salt, evolution_token_hash, last_gateway_error, created_at)"
                " VALUES ('admin-made', false, 100, 'open', now(), '', '', '', now())"
            )
        executor = MigrationExecutor(connection)
        with contextlib.redirect_stdout(out):
            executor.migrate([("messaging", "0007_instance_token_salt")])
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    migrated = Instance.objects.get(name="admin-made")
    assert SALT.match(migrated.token_salt)
    assert not migrated.check_webhook_token(unsalted_token("admin-made"))  # the old token stops working
    assert Instance.objects.get(pk=salted.pk).token_salt == salted.token_salt  # a salted one keeps its token
    assert "admin-made" in out.getvalue() and "already-salted" not in out.getvalue()
    assert "webhook_token --name" in out.getvalue()
