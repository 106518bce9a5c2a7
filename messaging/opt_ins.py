"""Recording and revoking transactional consent; history is kept (revoked rows stay)."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from . import rules
from .models import ApiKey, OptIn, Project

REVOKED_BY_API = "api"  # OptIn.revoked_source of DELETE /v1/opt-ins/{phone}


def record(project: Project, phone: str, source: str, actor: ApiKey | None = None) -> OptIn:
    """Consent is idempotent: recording it again keeps the live row (and its first source)."""
    existing: OptIn | None = OptIn.objects.filter(project=project, phone=phone, revoked_at__isnull=True).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return OptIn.objects.create(
                project=project, phone=phone, source=source, created_by=actor.display_prefix if actor else ""
            )
    except IntegrityError:
        # A concurrent request recorded it first (one_live_opt_in_per_phone).
        winner: OptIn = OptIn.objects.get(project=project, phone=phone, revoked_at__isnull=True)
        return winner


def revoke(project: Project, raw_phone: str, actor: ApiKey | None = None) -> OptIn | None:
    phone = rules.normalize_phone(raw_phone if raw_phone.startswith("+") else "+" + raw_phone.strip())
    if phone is None:
        return None
    opt_in: OptIn | None = OptIn.objects.filter(project=project, phone=phone, revoked_at__isnull=True).first()
    if opt_in is None:
        return None
    OptIn.objects.filter(pk=opt_in.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=actor.display_prefix if actor else "",
        revoked_source=REVOKED_BY_API if actor else "",
    )
    opt_in.refresh_from_db()
    return opt_in
