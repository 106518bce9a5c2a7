"""Acting on dead letters: force resend (docs/internals.md, "Dead letters") and dismiss, one entry or a selection.

The API, the dashboard, the bulk job and the admin all call these functions; they hold the
rules. A resend goes through the same funnel checks as a new message (docs/architecture.md, "Boundaries"):
an opt-in revoked since the first send refuses the resend with the funnel's reason and changes
nothing, and a message that failed OPTED_OUT is refused `opted_out` until its recipient has a new opt-in. Both actions are compare-and-set on the dead letter's OPEN status under a row lock, so
doing one twice (a double click, a client retry, a replayed bulk chunk) finds nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from . import lifecycle, rules
from .accept import SendRequest, check_funnel
from .errors import Rejected
from .models import Category, DeadLetter, DeadLetterStatus, EventKind, FailureReason, Message, Project, Status

# Outcomes, so that callers (and tests) can tell what happened without re-reading rows.
RESENT = "resent"
DISMISSED = "dismissed"
ALREADY_RESENT = "already_resent"
ALREADY_DISMISSED = "already_dismissed"
NOT_FAILED = "not_failed"


@dataclass(frozen=True)
class Done:
    outcome: str
    dead_letter: DeadLetter

    @property
    def changed(self) -> bool:
        return self.outcome in (RESENT, DISMISSED)


class AlreadyResolved(Rejected):
    """The entry was resolved the other way (dismissed, then asked to resend; or the reverse)."""

    def __init__(self, entry: DeadLetter):
        super().__init__(
            409,
            "dead_letter_resolved",
            f"This dead letter was already {entry.status.lower()}; nothing was changed.",
            {"status": entry.status, "resolvedBy": entry.resolved_by or None},
        )


class ConfirmationRequired(Rejected):
    """The message may have been delivered (OUTCOME_UNKNOWN): resending it may send it twice."""

    def __init__(self, entry: DeadLetter):
        super().__init__(
            409,
            "confirmation_required",
            "This message may already have been delivered (an answer from Evolution was lost): resending it "
            "may deliver it twice. Resend with confirmMaybeDelivered set to true to send it anyway.",
            {"reason": entry.reason, "outcomeUnknown": True},
        )


class OptedOut(Rejected):
    """The recipient opted out of this message (OPTED_OUT), and has no new opt-in since: resending it would send
    what they asked not to get."""

    def __init__(self, entry: DeadLetter, message: Message):
        super().__init__(
            422,
            "opted_out",
            "The recipient opted out before this message was sent: record a new opt-in for the number (POST "
            "/v1/opt-ins) before resending it, or correct the recipient. Nothing was changed.",
            {"reason": entry.reason, "to": message.to},
        )


def needs_confirmation(message: Message) -> bool:
    return message.outcome_unknown


def _already(entry: DeadLetter) -> str:
    return ALREADY_RESENT if entry.status == DeadLetterStatus.RESENT else ALREADY_DISMISSED


def _lock(dead_letter: DeadLetter) -> DeadLetter:
    # The row lock serialises two people acting on the same entry: the second waits, then sees
    # the first one's resolution and does nothing. Only the entry's own row (`of`), and FOR NO
    # KEY UPDATE: locking the joined project or message FOR UPDATE would hold up every accept
    # of the project (their foreign-key checks) until this transaction ends.
    locked: DeadLetter = (
        DeadLetter.objects.select_for_update(of=("self",), no_key=True)
        .select_related("message", "project")
        .get(pk=dead_letter.pk)
    )
    return locked


# A typed correction's bounds, the API's own (api.serializers: MAX_PHONE_LENGTH as written,
# MAX_INSTANCE_NAME_LENGTH = the column): checked before anything is looked up.
MAX_PHONE_LENGTH = 32
MAX_INSTANCE_NAME_LENGTH = 100


@dataclass(frozen=True)
class Correction:
    """A corrected recipient and/or instance for a resend (a customer's "the number was wrong, fixed,
    then Force Resend"). None keeps the message's own; `to` must already be E.164."""

    to: str | None = None
    instance: str | None = None

    def changes(self, message: Message) -> dict[str, dict[str, str | None]]:
        """What this correction changes on the message, old → new (empty when it changes nothing)."""
        changed: dict[str, dict[str, str | None]] = {}
        if self.to is not None and self.to != message.to:
            changed["to"] = {"old": message.to, "new": self.to}
        if self.instance is not None and self.instance != (message.requested_instance or None):
            changed["instance"] = {"old": message.requested_instance or None, "new": self.instance}
        return changed


NO_CORRECTION = Correction()


def check_correction(to: str | None, instance: str | None) -> Correction:
    """A correction as typed by a person (the dashboard): a number in international format, an
    instance name within its bound; blank means "keep". Rejected 400 otherwise, before anything."""
    fields: dict[str, list[str]] = {}
    phone = None
    if to is not None and to.strip():
        phone = rules.normalize_phone(to) if len(to) <= MAX_PHONE_LENGTH else None
        if phone is None:
            fields["to"] = ["Not a valid phone number in international E.164 format (e.g. +5511999990000)."]
    name = instance.strip() if instance is not None and instance.strip() else None
    if name is not None and (len(name) > MAX_INSTANCE_NAME_LENGTH or not name.isprintable()):
        fields["instance"] = [f"An instance name of at most {MAX_INSTANCE_NAME_LENGTH} printable characters."]
    if fields:
        raise Rejected(400, "invalid_request", "The correction is not valid.", {"fields": fields})
    return Correction(to=phone, instance=name)


def _send_request(message: Message, deliver_until: datetime, correction: Correction = NO_CORRECTION) -> SendRequest:
    return SendRequest(
        to=correction.to or message.to,
        category=message.category,
        template=message.template,
        variables=message.variables,
        instance=correction.instance or message.requested_instance or None,
        deliver_until=deliver_until,
        priority=message.priority,
        metadata=message.metadata,
    )


def check_deliver_until(category: str, deliver_until: datetime, now: datetime) -> None:
    code = rules.check_deliver_until(category, deliver_until, now)
    if code == "deliver_until_in_past":
        raise Rejected(400, "invalid_request", "deliverUntil must be in the future.",
                       {"fields": {"deliverUntil": ["Must be in the future."]}})
    if code == "deliver_until_too_far":
        limit = int(rules.MAX_TTL[Category(category)].total_seconds())
        raise Rejected(400, "invalid_request", f"deliverUntil is too far ahead for {category}.",
                       {"fields": {"deliverUntil": [f"At most {limit} s ahead for {category}."]}})


def force_resend(
    dead_letter: DeadLetter, actor: str, deliver_until: datetime | None = None, confirm_maybe_delivered: bool = False,
    correction: Correction = NO_CORRECTION,
) -> Done:
    """FAILED → QUEUED with a fresh attempt budget and deliverUntil; the entry becomes RESENT.

    A correction (a new `to` and/or `instance`) is judged by the whole funnel as the new request
    (environment, instance, opt-in); the RESENT line records it, old → new, with the actor.
    Raises Rejected when the funnel refuses (nothing is changed then) or when the entry was
    dismissed, and ConfirmationRequired for a message that may have been delivered (OUTCOME_UNKNOWN)
    unless the caller confirms it. Resending an entry that is already resent returns ALREADY_RESENT.
    """
    now = timezone.now()
    with transaction.atomic():
        entry = _lock(dead_letter)
        if entry.status == DeadLetterStatus.DISMISSED:
            raise AlreadyResolved(entry)
        if entry.status != DeadLetterStatus.OPEN:
            return Done(_already(entry), entry)
        message = entry.message
        if message.status != Status.FAILED:
            # A dead letter always belongs to a FAILED message; if not, someone else moved it.
            return Done(NOT_FAILED, entry)
        maybe_delivered = needs_confirmation(message)
        if maybe_delivered and not confirm_maybe_delivered:
            raise ConfirmationRequired(entry)
        if entry.reason == FailureReason.OPTED_OUT and correction.to in (None, message.to) \
                and not rules.has_live_opt_in(message.project, message.environment, message.to):
            raise OptedOut(entry, message)
        until = deliver_until or rules.deliver_until_for(message.category, now)
        check_deliver_until(message.category, until, now)
        corrected = correction.changes(message)
        request = _send_request(message, until, correction)
        instance = check_funnel(message.project, message.environment, request)
        corrected_fields = {"to": request.to, "requested_instance": request.instance or "", "instance": instance,
                            "deliver_until": until}
        if not lifecycle.resend(
            message, now, corrected_fields, actor, deadLetter=entry.pk, previousReason=entry.reason,
            instance=instance.name, deliverUntil=until.isoformat(),
            **({"confirmedMaybeDelivered": True} if maybe_delivered else {}),
            **({"corrected": corrected} if corrected else {}),
        ):
            return Done(NOT_FAILED, entry)
        DeadLetter.objects.filter(pk=entry.pk).update(
            status=DeadLetterStatus.RESENT, resolved_by=actor, resolved_at=now, updated_at=now
        )
        entry.refresh_from_db()
    return Done(RESENT, entry)


def dismiss(dead_letter: DeadLetter, actor: str) -> Done:
    """OPEN → DISMISSED: someone looked at it and decided not to deliver. The message stays FAILED."""
    now = timezone.now()
    with transaction.atomic():
        entry = _lock(dead_letter)
        if entry.status == DeadLetterStatus.RESENT:
            raise AlreadyResolved(entry)
        if entry.status != DeadLetterStatus.OPEN:
            return Done(_already(entry), entry)
        DeadLetter.objects.filter(pk=entry.pk, status=DeadLetterStatus.OPEN).update(
            status=DeadLetterStatus.DISMISSED, resolved_by=actor, resolved_at=now, updated_at=now
        )
        entry.message.record(EventKind.DISMISSED, actor=actor, deadLetter=entry.pk, reason=entry.reason)
        entry.refresh_from_db()
    return Done(DISMISSED, entry)


# ---- selections ---------------------------------------------------------------------------

FILTER_FIELDS = ("status", "reason", "category", "to", "created_after", "created_before")


def matching(project: Project | None, environment: str | None, filters: dict[str, Any]) -> QuerySet[DeadLetter]:
    """Dead letters of a project in one environment (every project and environment for operators: None)
    that match the filters.

    One definition of "matching" for the API list, the dashboard list and a bulk job replaying
    the filter a person saw; unknown or empty filters are ignored.
    """
    rows: QuerySet[DeadLetter] = DeadLetter.objects.all()
    if project is not None:
        if environment is None:
            raise ValueError("a project's dead letters are read in one environment")
        rows = DeadLetter.objects.for_scope(project, environment)
    if filters.get("status"):
        rows = rows.filter(status=filters["status"])
    if filters.get("reason"):
        rows = rows.filter(reason=filters["reason"])
    if filters.get("category"):
        rows = rows.filter(message__category=filters["category"])
    if filters.get("to"):
        rows = rows.filter(message__to=filters["to"])
    if filters.get("created_after"):
        rows = rows.filter(created_at__gte=filters["created_after"])
    if filters.get("created_before"):
        rows = rows.filter(created_at__lt=filters["created_before"])
    return rows


@dataclass
class Tally:
    resent: int = 0
    refused: int = 0
    skipped: int = 0
    last_id: int = 0

    @property
    def processed(self) -> int:
        return self.resent + self.refused + self.skipped


def resend_each(entries: list[DeadLetter], actor: str) -> Tally:
    """Force-resend a chunk, counting what happened; one refusal never stops the others. A message
    that may have been delivered is refused (ConfirmationRequired): a bulk action never confirms that."""
    tally = Tally()
    for entry in entries:
        tally.last_id = max(tally.last_id, entry.pk)
        try:
            done = force_resend(entry, actor)
        except Rejected:
            tally.refused += 1
            continue
        if done.changed:
            tally.resent += 1
        else:
            tally.skipped += 1
    return tally
