"""Inbound opt-out (issue 23 §3): a recipient who writes an opt-out keyword to a project's instance
revokes their opt-in for that project; later non-OTP sends to them are refused `opt_in_required`.

`on_inbound` is the one entry, called by ingestion for a `messages.upsert` that is not ours (fromMe
false), with the sender's number already read from Evolution's jids. The keyword must be the whole
message: trimmed, inner spaces collapsed, case and accents ignored ("Parar", "  stop ", "CANCELAR
SUSCRIPCIÓN"); "please stop sending" is not one. The keywords are the project's own
(`Project.opt_out_keywords`, defaults in Portuguese, Spanish and English).

The revocation is a conditional UPDATE of the live row (revoked_at IS NULL), so the same event arriving
on both channels (the inbox stores it once anyway), or the keyword written twice, revokes once. It keeps
its source (`revoked_source = inbound_keyword`, `revoked_reference = inbox:<event id>`), which the
opt_in.revoked callback and admin show.
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass

from django.utils import timezone

from . import rules
from .models import DEFAULT_OPT_OUT_KEYWORDS, MAX_OPT_OUT_KEYWORD_LENGTH, Instance, OptIn

log = logging.getLogger(__name__)

INBOUND_KEYWORD = "inbound_keyword"  # OptIn.revoked_source
# Outcomes (the inbox row's outcome; tests read them).
REVOKED = "opt_out_revoked"
NOT_OPTED_IN = "opt_out_not_opted_in"  # a keyword, but no live opt-in to revoke
NOT_A_KEYWORD = "stored"  # an ordinary inbound message: kept in the inbox, no effect
NO_PROJECT = "opt_out_no_project"  # a keyword to a Pilot Status instance: no one project's consent

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
    the ninth digit (+55 31 9xxxx-xxxx) but WhatsApp's jid may drop it (evolution-api.md §8): a STOP
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
    """Revoke the sender's opt-in for the instance's project when the text is an opt-out keyword."""
    if not could_be_keyword(inbound.text):
        return NOT_A_KEYWORD
    instance = Instance.objects.select_related("project").filter(name=inbound.instance_name).first()
    if instance is None:
        return "unknown_instance"
    project = instance.project
    if project is None:
        if is_opt_out(inbound.text, DEFAULT_OPT_OUT_KEYWORDS):
            # A shared Pilot Status number speaks for many projects: which one's consent ends is not known.
            log.warning("opt-out keyword from %s to Pilot Status instance %s: no project's opt-in revoked (%s)",
                        inbound.phone, instance.name, inbound.reference)
            return NO_PROJECT
        return NOT_A_KEYWORD
    if not is_opt_out(inbound.text, project.opt_out_keywords):
        return NOT_A_KEYWORD
    phones = [p for p in phone_variants(inbound.phone) if rules.normalize_phone(p) == p]
    revoked = OptIn.objects.filter(project=project, phone__in=phones, revoked_at__isnull=True).update(
        revoked_at=timezone.now(),
        revoked_by=INBOUND_KEYWORD,
        revoked_source=INBOUND_KEYWORD,
        revoked_reference=inbound.reference[:80],
    )
    if not revoked:
        log.info("opt-out keyword from %s to %s: no live opt-in for project %s (%s)",
                 inbound.phone, instance.name, project.pk, inbound.reference)
        return NOT_OPTED_IN
    log.info("opt-out keyword from %s to %s revoked project %s's opt-in (%s)",
             inbound.phone, instance.name, project.pk, inbound.reference)
    return REVOKED
