"""Operator commands print JSON (contract §2) and their keys work against the API."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from messaging.models import ApiKey, Instance, Project


def run(*args: str) -> dict:
    out = StringIO()
    call_command(*args, stdout=out)
    return json.loads(out.getvalue())


def test_create_project_prints_keys_shown_once(db):
    result = run("create_project", "--name", "Shop", "--test-number", "+5511999990000", "--production-approved")
    assert result["test_api_key"].startswith("ps_test_")
    assert result["live_api_key"].startswith("ps_live_")
    project = Project.objects.get(pk=result["project_id"])
    assert project.production_approved
    stored = list(ApiKey.objects.filter(project=project).values_list("key_hash", flat=True))
    assert result["live_api_key"] not in stored and len(stored) == 2


def test_create_project_refuses_a_bad_number(db):
    with pytest.raises(CommandError):
        run("create_project", "--name", "Shop", "--test-number", "12345")
    assert Project.objects.count() == 0


def test_add_instance_prints_a_webhook_token(db):
    project = run("create_project", "--name", "Shop", "--test-number", "+5511999990000")["project_id"]
    own = run("add_instance", "--name", "shop-1", "--project", str(project), "--priority", "5", "--token", "T1")
    official = run("add_instance", "--name", "ps-official", "--official")
    assert own["name"] == "shop-1" and len(own["webhook_token"]) == 64
    instance = Instance.objects.get(name="shop-1")
    assert instance.priority == 5 and instance.check_evolution_token("T1")
    assert Instance.objects.get(pk=official["instance_id"]).is_official
    # the token itself is not stored: it is derived from SECRET_KEY and a salt
    assert own["webhook_token"] not in json.dumps(list(Instance.objects.values()), default=str)


def test_create_member(db):
    project = run("create_project", "--name", "Shop", "--test-number", "+5511999990000")["project_id"]
    result = run("create_member", "--project", str(project), "--username", "ana", "--password", "pw-123456")
    assert Project.objects.get(pk=project).members.filter(pk=result["user_id"]).exists()


def test_a_revoked_key_gets_401(db):
    from rest_framework.test import APIClient

    created = run("create_project", "--name", "Shop", "--test-number", "+5511999990000")
    run("revoke_key", "--prefix", created["live_api_key"][:12])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created['live_api_key']}")
    assert client.get("/v1/messages").status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created['test_api_key']}")
    assert client.get("/v1/messages").status_code == 200
