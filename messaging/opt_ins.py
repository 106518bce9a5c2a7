"""Recording and revoking transactional consent; history is kept (revoked rows stay).

A consent belongs to one environment (the sandbox rule, docs/security.md): a key records and revokes the
consents of its own environment only, so a TEST key can neither let a LIVE send through nor end a LIVE
consent. A recipient's own opt-out keyword ends their consent in every environment (messaging.opt_outs).
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from . import opt_outs, rules
from .models import ApiKey, Environment, OptIn, Project

REVOKED_BY_API = "api"  # OptIn.revoked_source of DELETE /v1/opt-ins/{phone}


def _environment(actor: ApiKey | None, environment: str) -> str:
    # A key acts in its own environment, whatever it is asked.
    return str(actor.environment) if actor is not None else environment


def record(project: Project, phone: str, source: str, actor: ApiKey | None = None, *,
           environment: str = Environment.LIVE) -> OptIn:
    """Consent is idempotent: recording it again keeps the live row (and its first source)."""
    scope = _environment(actor, environment)
    live = OptIn.objects.filter(project=project, environment=scope, phone=phone, revoked_at__isnull=True)
    existing: OptIn | None = live.first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return OptIn.objects.create(
                project=project, environment=scope, phone=phone, source=source,
                created_by=actor.display_prefix if actor else "",
            )
    except IntegrityError:
        # A concurrent request recorded it first (one_live_opt_in_per_phone).
        winner: OptIn = live.get()
        return winner


def revoke(project: Project, raw_phone: str, actor: ApiKey | None = None, *,
           environment: str = Environment.LIVE) -> OptIn | None:
    phone = rules.normalize_phone(raw_phone if raw_phone.startswith("+") else "+" + raw_phone.strip())
    if phone is None:
        return None
    opt_in: OptIn | None = OptIn.objects.filter(
        project=project, environment=_environment(actor, environment), phone=phone, revoked_at__isnull=True
    ).first()
    if opt_in is None:
        return None
    # Its queued non-OTP messages fail OPTED_OUT with it (messaging.consent).
    opt_outs.revoke_and_withdraw(OptIn.objects.filter(pk=opt_in.pk), actor.display_prefix if actor else "",
                                 REVOKED_BY_API if actor else "", why="the opt-in was revoked")
    opt_in.refresh_from_db()
    return opt_in
