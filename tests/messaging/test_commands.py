"""Operator commands print JSON (README, "API quick start") and their keys work against the API."""

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


def refused(capsys, *args: str) -> dict:
    """Run a command that must fail: CommandError (exit 1 under manage.py), a JSON error on stderr, nothing on stdout."""
    capsys.readouterr()
    out = StringIO()
    with pytest.raises(CommandError):
        call_command(*args, stdout=out)
    assert out.getvalue() == ""
    return json.loads(capsys.readouterr().err.strip().splitlines()[-1])


def _shared_prefix_keys(project: Project) -> list[ApiKey]:
    # Two live keys whose 12-character display prefix is the same (64^4 prefixes: it happens).
    keys = [ApiKey.issue(project, "LIVE")[0] for _ in range(2)]
    ApiKey.objects.filter(pk__in=[k.pk for k in keys]).update(display_prefix="ps_live_SaMe")
    return keys


def test_revoke_key_refuses_an_ambiguous_prefix_and_revokes_nothing(db, capsys):
    project = Project.objects.get(pk=run("create_project", "--name", "Shop", "--test-number", "+5511999990000")["project_id"])
    first, second = _shared_prefix_keys(project)

    error = refused(capsys, "revoke_key", "--prefix", "ps_live_SaMe")

    assert "ambiguous" in error["error"] and str(first.pk) in error["error"] and str(second.pk) in error["error"]
    assert ApiKey.objects.filter(pk__in=[first.pk, second.pk], revoked_at__isnull=True).count() == 2


def test_revoke_key_by_full_key_id_revokes_that_key_only(db):
    project = Project.objects.get(pk=run("create_project", "--name", "Shop", "--test-number", "+5511999990000")["project_id"])
    first, second = _shared_prefix_keys(project)

    assert run("revoke_key", "--key-id", str(first.pk)) == {"revoked": [first.pk]}

    first.refresh_from_db(), second.refresh_from_db()
    assert first.revoked_at is not None and second.revoked_at is None


@pytest.mark.parametrize("args", [
    ["--key-id", "999999"],                 # no such key
    ["--key-id", "99999999999999999999999"],  # out of range
    [],                                     # neither
    ["--key-id", "1", "--prefix", "ps_live_AbCd"],  # both
])
def test_revoke_key_refuses_a_missing_or_unclear_key(db, capsys, args):
    assert refused(capsys, "revoke_key", *args)["error"]


def test_create_member_refuses_an_existing_user_without_reset_password(db, capsys):
    from django.contrib.auth import get_user_model

    project = run("create_project", "--name", "Shop", "--test-number", "+5511999990000")["project_id"]
    run("create_member", "--project", str(project), "--username", "ana", "--password", "pw-123456")
    user = get_user_model().objects.get(username="ana")
    before = user.password

    error = refused(capsys, "create_member", "--project", str(project), "--username", "ana", "--password", "other-pw-1")

    assert "already exists" in error["error"] and "--reset-password" in error["error"]
    user.refresh_from_db()
    assert user.password == before and user.check_password("pw-123456")


def test_create_member_resets_a_members_password_when_asked(db):
    from django.contrib.auth import get_user_model

    first = run("create_project", "--name", "Shop", "--test-number", "+5511999990000")["project_id"]
    second = run("create_project", "--name", "Shop 2", "--test-number", "+5511999990000")["project_id"]
    created = run("create_member", "--project", str(first), "--username", "ana", "--password", "pw-123456")

    again = run("create_member", "--project", str(second), "--username", "ana", "--password", "new-pw-789",
                "--reset-password")

    assert again == created
    user = get_user_model().objects.get(username="ana")
    assert user.check_password("new-pw-789")
    assert set(user.projects.values_list("pk", flat=True)) == {first, second}


@pytest.mark.parametrize("flags", [[], ["--reset-password"]])
def test_create_member_never_touches_a_superuser(db, capsys, flags):
    from django.contrib.auth import get_user_model

    project = run("create_project", "--name", "Shop", "--test-number", "+5511999990000")["project_id"]
    root = get_user_model().objects.create_superuser("root", "root@example.com", "root-password-123")
    before = root.password

    error = refused(capsys, "create_member", "--project", str(project), "--username", "root",
                    "--password", "taken-over-1", *flags)

    assert "superuser" in error["error"]
    root.refresh_from_db()
    assert root.password == before and not root.projects.exists()
