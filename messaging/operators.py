"""Operator actions behind the management commands (README, "API quick start") and `seed_demo`."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from . import rules
from .models import ApiKey, Environment, Instance, Project, SendProfile
from .tokens import hash_secret, new_token_salt


class OperatorError(Exception):
    pass


def create_project(name: str, test_number: str, production_approved: bool = False) -> dict[str, Any]:
    phone = rules.normalize_phone(test_number)
    if phone is None:
        raise OperatorError(f"--test-number {test_number!r} is not a valid E.164 number")
    with transaction.atomic():
        project = Project.objects.create(name=name, test_number=phone, production_approved=production_approved)
        _, test_key = ApiKey.issue(project, Environment.TEST)
        _, live_key = ApiKey.issue(project, Environment.LIVE)
    return {"project_id": project.pk, "test_api_key": test_key, "live_api_key": live_key}


def add_instance(
    name: str,
    project_id: int | None = None,
    official: bool = False,
    priority: int = 100,
    token: str | None = None,
    profile: str = SendProfile.UNOFFICIAL,
) -> dict[str, Any]:
    if profile not in SendProfile.values:
        raise OperatorError(f"--profile {profile!r}: one of {', '.join(SendProfile.values)}")
    project = None
    if project_id is not None:
        project = Project.objects.filter(pk=project_id).first()
        if project is None:
            raise OperatorError(f"--project {project_id}: no such project")
    if official and project is not None:
        raise OperatorError("--official is for Pilot Status instances (no --project)")
    if Instance.objects.filter(name=name).exists():
        raise OperatorError(f"instance {name!r} already exists")
    instance = Instance.objects.create(
        name=name,
        project=project,
        is_official=official,
        priority=priority,
        send_profile=profile,
        evolution_token_hash=hash_secret(token) if token else "",
    )
    return {"instance_id": instance.pk, "name": instance.name, "webhook_token": instance.webhook_token}


def webhook_token(name: str, rotate: bool = False) -> dict[str, Any]:
    """An instance's webhook token (the `x-webhook-token` Evolution must send), for an operator who
    re-registers the webhook: after migration 0007 gave the instance a salt, or after `rotate`
    drew a new one (the old token stops working within ingestion.auth.AUTH_CACHE_SECONDS)."""
    instance = Instance.objects.filter(name=name).first()
    if instance is None:
        raise OperatorError(f"instance {name!r} does not exist")
    if rotate:
        instance.token_salt = new_token_salt()
        instance.save(update_fields=["token_salt"])
    return {"instance_id": instance.pk, "name": instance.name, "webhook_token": instance.webhook_token}


def create_member(project_id: int, username: str, password: str, reset_password: bool = False) -> dict[str, Any]:
    """Make a dashboard user a member of a project.

    An existing user is refused unless `reset_password` is given (then their password is set and they
    join the project); a superuser is never touched, with or without it: this command must not be a
    way to take over an operator's account. The password must pass AUTH_PASSWORD_VALIDATORS, as in admin.
    """
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        raise OperatorError(f"--project {project_id}: no such project")
    User = get_user_model()
    with transaction.atomic():
        user = User.objects.select_for_update().filter(username=username).first()
        if user is not None and user.is_superuser:
            raise OperatorError(f"user {username!r} is a superuser; create_member never changes a superuser")
        if user is not None and not reset_password:
            raise OperatorError(
                f"user {username!r} already exists; pass --reset-password to set a new password "
                f"and add them to project {project_id}"
            )
        if user is None:
            user = User(username=username)
        try:
            validate_password(password, user)
        except ValidationError as weak:
            raise OperatorError(f"--password is refused: {' '.join(weak.messages)}") from weak
        user.set_password(password)
        user.save()
        project.members.add(user)
    return {"user_id": user.pk}


def revoke_key(key_id: int | None = None, prefix: str | None = None) -> dict[str, Any]:
    """Revoke one API key: by its id (`key_id` from issue_key, the id column in admin), or by the
    12-character prefix shown in admin (e.g. `ps_live_AbCd`) when exactly one active key has it.

    Prefixes are short (4 random characters), so two keys can share one: an ambiguous prefix is
    refused with the candidates' ids instead of revoking every key that shares it.
    """
    if (key_id is None) == (prefix is None):
        raise OperatorError("give exactly one of --key-id (the key's id) or --prefix (e.g. ps_live_AbCd)")
    if key_id is not None:
        key = ApiKey.objects.filter(pk=key_id).first()
        if key is None:
            raise OperatorError(f"--key-id {key_id}: no such key")
        if not key.revoke():
            raise OperatorError(f"--key-id {key_id}: already revoked")
        return {"revoked": [key.pk]}
    assert prefix is not None
    if len(prefix) < 12:
        raise OperatorError("--prefix must be the 12-character prefix shown in admin (e.g. ps_live_AbCd)")
    prefix = prefix[:12]
    keys = list(ApiKey.objects.filter(display_prefix=prefix, revoked_at__isnull=True).order_by("pk"))
    if not keys:
        raise OperatorError(f"no active key with prefix {prefix!r}")
    if len(keys) > 1:
        ids = ", ".join(str(key.pk) for key in keys)
        raise OperatorError(f"ambiguous prefix {prefix!r}: active keys {ids} share it; revoke one with --key-id")
    return {"revoked": [key.pk for key in keys if key.revoke()]}


def issue_key(project_id: int, environment: str) -> dict[str, Any]:
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        raise OperatorError(f"--project {project_id}: no such project")
    if environment not in Environment.values:
        raise OperatorError("--environment must be TEST or LIVE")
    key, raw = ApiKey.issue(project, environment)
    return {"key_id": key.pk, "api_key": raw, "environment": environment}
