"""Inbound opt-out (issue 23 §3): a recipient who writes an opt-out keyword to a project's instance
revokes their opt-in for that project, in both environments (consent is the person's: their own word
ends it everywhere, and can only stop sends; docs/security.md, the sandbox rule); their queued non-OTP messages
fail OPTED_OUT at once (messaging.consent), and later non-OTP sends to them are refused `opt_in_required`. A
keyword written to a shared Pilot Status instance ends every project's consent for that number: the person sees
one chat per number (docs/security.md, "Consent", says why).

`on_inbound` is the one entry, called by ingestion for a `messages.upsert` that is not ours (fromMe
false), with the sender's number already read from Evolution's jids. The keyword must be the whole
message: trimmed, inner spaces collapsed, case and accents ignored ("Parar", "  stop ", "CANCELAR
SUSCRIPCIÓN"); "please stop sending" is not one. The keywords are the project's own
(`Project.opt_out_keywords`, defaults in Portuguese, Spanish and English); a shared instance's are the defaults.

The revocation is a conditional UPDATE of the live row (revoked_at IS NULL), so the same event arriving
on both channels (the inbox stores it once anyway), or the keyword written twice, revokes once. It keeps
its source (`revoked_source = inbound_keyword`, `revoked_reference = inbox:<event id>`), which the
opt_in.revoked callback and admin show.
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from . import consent, governor, lifecycle, rules
from .models import (
    DEFAULT_OPT_OUT_KEYWORDS,
    MAX_OPT_OUT_KEYWORD_LENGTH,
    Category,
    FailureReason,
    Instance,
    Message,
    OptIn,
    Status,
)

log = logging.getLogger(__name__)

INBOUND_KEYWORD = "inbound_keyword"  # OptIn.revoked_source
# Outcomes (the inbox row's outcome; tests read them).
REVOKED = "opt_out_revoked"
NOT_OPTED_IN = "opt_out_not_opted_in"  # a keyword, but no live opt-in to revoke
NOT_A_KEYWORD = "stored"  # an ordinary inbound message: kept in the inbox, no effect

# Longer texts are never a keyword: no database read for an ordinary conversation. Generous, since
# a keyword may be written with spaces and accents that normalising removes.
_LONGEST_TEXT = MAX_OPT_OUT_KEYWORD_LENGTH * 2


def normalize(text: str) -> str:
    """A text as keywords are compared: accents removed, case folded, whitespace trimmed and collapsed."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return " ".join(plain.casefold().split())


def is_opt_out(text: str, keywords: list[str]) -> bool:
    wanted = normalize(text)
    return bool(wanted) and any(wanted == normalize(keyword) for keyword in keywords)


def phone_variants(phone: str) -> list[str]:
    """The E.164 numbers one WhatsApp sender may be recorded under. Brazil's mobiles are written with
    the ninth digit (+55 31 9xxxx-xxxx) but WhatsApp's jid may drop it (docs/evolution-setup.md, "Ids and jids"): a STOP
    from 553199999999 must revoke the opt-in recorded for +5531999999999, and the reverse."""
    variants = [phone]
    digits = phone.lstrip("+")
    if digits.startswith("55") and len(digits) == 12 and digits[4] in "6789":
        variants.append(f"+{digits[:4]}9{digits[4:]}")
    elif digits.startswith("55") and len(digits) == 13 and digits[4] == "9":
        variants.append(f"+{digits[:4]}{digits[5:]}")
    return variants


def phone_from_digits(digits: str) -> str | None:
    """The valid E.164 number behind a jid's digits (a Brazilian jid without the ninth digit is not
    valid as written: its variant with it is), or None."""
    for candidate in phone_variants(f"+{digits}"):
        if rules.normalize_phone(candidate) == candidate:
            return candidate
    return None


@dataclass(frozen=True)
class Inbound:
    """An inbound text, as ingestion read it from Evolution."""

    instance_name: str
    phone: str  # the sender, E.164
    text: str
    reference: str  # what shows it, e.g. `inbox:<event id>`


def could_be_keyword(text: str) -> bool:
    """A cheap first look, before any read: a long or blank text is never a keyword."""
    return len(text) <= _LONGEST_TEXT and bool(normalize(text))


def on_inbound(inbound: Inbound) -> str:
    """Revoke the sender's opt-ins when the text is an opt-out keyword: the instance's project's, or on a shared
    Pilot Status instance every project's (docs/security.md, "Consent"); their queued messages fail OPTED_OUT."""
    if not could_be_keyword(inbound.text):
        return NOT_A_KEYWORD
    instance = Instance.objects.select_related("project").filter(name=inbound.instance_name).first()
    if instance is None:
        return "unknown_instance"
    project = instance.project
    # A shared number speaks for many projects: its keywords are the defaults, no one project's own list.
    keywords = DEFAULT_OPT_OUT_KEYWORDS if project is None else project.opt_out_keywords
    if not is_opt_out(inbound.text, keywords):
        return NOT_A_KEYWORD
    # People who ask a number to stop are the ones who report it: a signal of its health (messaging.governor).
    governor.safely(governor.opt_out, instance.name, inbound.phone)
    phones = [p for p in phone_variants(inbound.phone) if rules.normalize_phone(p) == p]
    live = OptIn.objects.filter(phone__in=phones, revoked_at__isnull=True)
    if project is not None:
        live = live.filter(project=project)
    whose = f"project {project.pk}'s" if project is not None else "every project's"
    revoked = revoke_and_withdraw(live, INBOUND_KEYWORD, INBOUND_KEYWORD, inbound.reference[:80],
                                  why=f"the recipient wrote {normalize(inbound.text).upper()!r} to {instance.name}")
    if not revoked:
        log.info("opt-out keyword from %s to %s: no live opt-in of %s (%s)",
                 inbound.phone, instance.name, whose.removesuffix("'s"), inbound.reference)
        return NOT_OPTED_IN
    log.info("opt-out keyword from %s to %s revoked %s opt-in (%d; %s)",
             inbound.phone, instance.name, whose, revoked, inbound.reference)
    return REVOKED


def revoke_and_withdraw(live: QuerySet[OptIn], revoked_by: str, source: str, reference: str = "", *, why: str) -> int:
    """Revoke the live consents `live` selects, and fail each one's queued non-OTP messages OPTED_OUT
    (messaging.consent), in one transaction; how many were revoked. The revoke is conditional on the live row,
    so the same opt-out applied twice (both channels, a keyword written twice) revokes and withdraws once."""
    with transaction.atomic():
        rows = list(live.values_list("pk", "project_id", "environment", "phone"))
        revoked = OptIn.objects.filter(pk__in=[row[0] for row in rows], revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=revoked_by, revoked_source=source, revoked_reference=reference,
        )
        if revoked:
            withdraw_queued({row[1:] for row in rows}, why)
    return revoked


def withdraw_queued(consents: set[tuple[int, str, str]], why: str) -> int:
    """Fail OPTED_OUT every queued non-OTP message of these ended consents (project id, environment, phone),
    with a dead letter; how many. Read through the partial index of queued messages by number (msg_queued_to)."""
    phones = {phone for _, _, phone in consents}
    queued = Message.objects.filter(
        to__in=phones, status=Status.QUEUED, project_id__in={project for project, _, _ in consents}
    ).exclude(category=Category.OTP).order_by("created_at")
    failed = 0
    for message in queued:
        if (message.project_id, message.environment, message.to) in consents:
            failed += lifecycle.withdraw(message, FailureReason.OPTED_OUT, consent.DETAIL.format(why=why))
    return failed
