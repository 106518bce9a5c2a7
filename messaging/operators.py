"""Operator actions behind the management commands (contract §2) and `seed_demo`."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from . import rules
from .models import ApiKey, Environment, Instance, Project, hash_secret, new_token_salt


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
) -> dict[str, Any]:
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
        evolution_token_hash=hash_secret(token) if token else "",
    )
    return {"instance_id": instance.pk, "name": instance.name, "webhook_token": instance.webhook_token}


def webhook_token(name: str, rotate: bool = False) -> dict[str, Any]:
    """An instance's webhook token (the `x-webhook-token` Evolution must send), for an operator who
    re-registers the webhook: after migration 0006 gave the instance a salt, or after `rotate`
    drew a new one (the old token stops working within ingestion.auth.AUTH_CACHE_SECONDS)."""
    instance = Instance.objects.filter(name=name).first()
    if instance is None:
        raise OperatorError(f"instance {name!r} does not exist")
    if rotate:
        instance.token_salt = new_token_salt()
        instance.save(update_fields=["token_salt"])
    return {"instance_id": instance.pk, "name": instance.name, "webhook_token": instance.webhook_token}


def create_member(project_id: int, username: str, password: str) -> dict[str, Any]:
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        raise OperatorError(f"--project {project_id}: no such project")
    User = get_user_model()
    with transaction.atomic():
        user, created = User.objects.get_or_create(username=username)
        if created or password:
            user.set_password(password)
            user.save()
        project.members.add(user)
    return {"user_id": user.pk}


def revoke_key(prefix: str) -> dict[str, Any]:
    """Revoke API keys by the prefix shown in admin (e.g. `ps_live_AbCd`); returns what was revoked."""
    if len(prefix) < 12:
        raise OperatorError("--prefix must be the 12-character prefix shown in admin (e.g. ps_live_AbCd)")
    keys = list(ApiKey.objects.filter(display_prefix=prefix[:12], revoked_at__isnull=True))
    if not keys:
        raise OperatorError(f"no active key with prefix {prefix[:12]!r}")
    revoked = [key.pk for key in keys if key.revoke()]
    return {"revoked": revoked}


def issue_key(project_id: int, environment: str) -> dict[str, Any]:
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        raise OperatorError(f"--project {project_id}: no such project")
    if environment not in Environment.values:
        raise OperatorError("--environment must be TEST or LIVE")
    key, raw = ApiKey.issue(project, environment)
    return {"key_id": key.pk, "api_key": raw, "environment": environment}
