"""The checks of the sending funnel (docs/internals.md, "Path of a message"), as plain functions.

Each takes what it judges and returns the contract's error code, or None when the check passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

import phonenumbers

from . import test_numbers
from .models import Category, ConnectionState, Environment, Instance, OptIn, Project

DEFAULT_TTL = {
    Category.OTP: timedelta(minutes=2),
    Category.UTILITY: timedelta(hours=1),
    Category.MARKETING: timedelta(hours=4),
}
# The longest deliverUntil a client may ask for: an OTP that arrives after ten minutes is
# worse than a visible failure; marketing may wait a day, no more.
MAX_TTL = {
    Category.OTP: timedelta(minutes=10),
    Category.UTILITY: timedelta(hours=24),
    Category.MARKETING: timedelta(hours=72),
}



def _span(delta: timedelta) -> str:
    minutes = int(delta.total_seconds()) // 60
    return f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} min"


def deliver_until_help() -> str:
    """deliverUntil's defaults and limits per category, for the OpenAPI schema."""
    parts = [f"{c.value} +{_span(DEFAULT_TTL[c])} (at most +{_span(MAX_TTL[c])})" for c in Category]
    return (
        "When to give up and fail the message EXPIRED; in the future. Default and limit by category: "
        + ", ".join(parts) + "."
    )


VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\}\}")
# WhatsApp's limit on a text message, checked on the text as rendered (the template with its
# variables filled in), before anything is stored: a short template and a long value referenced
# many times would otherwise store, send and display megabytes (issue 21).
MAX_RENDERED_LENGTH = 4096


def deliver_until_for(category: str, now: datetime) -> datetime:
    return now + DEFAULT_TTL[Category(category)]


def check_deliver_until(category: str, deliver_until: datetime, now: datetime) -> str | None:
    if deliver_until <= now:
        return "deliver_until_in_past"
    if deliver_until - now > MAX_TTL[Category(category)]:
        return "deliver_until_too_far"
    return None


def normalize_phone(raw: str) -> str | None:
    """E.164 form of a number given in international format, or None when it is not valid."""
    candidate = raw.strip()
    if not candidate.startswith("+"):
        return None
    try:
        parsed = phonenumbers.parse(candidate, None)
    except phonenumbers.NumberParseException:
        return None
    if not phonenumbers.is_valid_number(parsed):
        return None
    return phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)


def missing_variables(template: str, variables: dict[str, object]) -> list[str]:
    return sorted({name for name in VARIABLE.findall(template) if name not in variables})


def rendered_length(template: str, variables: dict[str, object]) -> int:
    """len(render(template, variables)) without building the text: the template, less each
    placeholder, plus its value as text (a missing name counts as its placeholder)."""
    if "{{" not in template:
        return len(template)
    length = len(template)
    for match in VARIABLE.finditer(template):
        name = match.group(1)
        if name in variables:
            value = variables[name]
            length += (len(value) if type(value) is str else len(str(value))) - (match.end() - match.start())
    return length


def render(template: str, variables: dict[str, object]) -> str:
    return VARIABLE.sub(lambda m: str(variables[m.group(1)]), template)


def check_environment(project: Project, environment: str, to: str) -> str | None:
    # TEST: the project's test number, or a magic number that simulates an outcome (messaging.test_numbers).
    if environment == Environment.TEST and to != project.test_number and not test_numbers.is_magic(to):
        return "test_recipient_not_allowed"
    if environment == Environment.LIVE and not project.production_approved:
        return "production_not_approved"
    return None


def has_live_opt_in(project: Project, environment: str, phone: str) -> bool:
    return OptIn.objects.filter(project=project, environment=environment, phone=phone, revoked_at__isnull=True).exists()


@dataclass(frozen=True)
class InstanceCandidates:
    """The few instances the first choice can fall on, each the best of its group.

    own: the project's instance named in the request, or else its best one (open first, then
    priority); official: the best official Pilot Status number; shared: the best Pilot Status
    instance. "Best" is open first, then priority, then id (OPEN_FIRST). The accept funnel reads
    all three in the same query as the opt-in and the Idempotency-Key (messaging.accept).
    """

    own: Instance | None = None
    official: Instance | None = None
    shared: Instance | None = None


# The order that makes "the best" instance of a group (see InstanceCandidates).
OPEN_FIRST = f"connection_state <> '{ConnectionState.OPEN.value}', priority, id"


def resolve_instance(
    category: str, requested: str | None, opted_in: bool, candidates: InstanceCandidates
) -> tuple[Instance | None, str | None]:
    """Choose the instance a message goes through (docs/api.md, POST /v1/messages/send), or say why none may be used."""
    own = candidates.own
    if requested:
        return (own, None) if own is not None else (None, "unknown_instance")
    if category == Category.MARKETING:
        return (own, None) if own is not None else (None, "own_instance_required")
    if category == Category.OTP and not opted_in and candidates.official is not None:
        # Without consent an OTP may only go through the official number.
        return candidates.official, None
    if own is not None and own.connection_state == ConnectionState.OPEN:
        return own, None
    if candidates.shared is not None:
        return candidates.shared, None
    # No open instance anywhere: keep the project's own (it will wait for a reconnect).
    return (own, None) if own is not None else (None, "no_instance_available")


def check_opt_in(category: str, instance: Instance, opted_in: bool) -> str | None:
    if opted_in:
        return None
    if category == Category.OTP and instance.is_official:
        return None
    return "opt_in_required"


def may_route_to(category: str, project_id: int, owner_id: int | None) -> bool:
    """Whether a message of this project and category may go through an instance of `owner_id` (None: Pilot Status'
    shared ones): its project's own, and (not for MARKETING) the shared ones. The opt-in rule comes on top."""
    return owner_id == project_id or (owner_id is None and category != Category.MARKETING)


def fallback_instances(project: Project, category: str, opted_in: bool, exclude: list[int]) -> list[Instance]:
    """Open instances a queued message may be re-routed to, best first (issue 4 §4).

    The same rules as the first choice: the project's own instances by priority, then the shared ones where
    `may_route_to` allows them; without opt-in only an OTP on the official number.
    """
    open_ones = Instance.objects.filter(connection_state=ConnectionState.OPEN).exclude(pk__in=exclude)
    candidates = list(open_ones.filter(project=project).order_by("priority", "pk"))
    if may_route_to(category, project.pk, None):  # the shared ones are read only where they may be used
        candidates += list(open_ones.filter(project__isnull=True).order_by("priority", "pk"))
    return [instance for instance in candidates if check_opt_in(category, instance, opted_in) is None]
