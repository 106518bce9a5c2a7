"""The lost answer's resolution: a claim of a message whose last answer from Evolution was lost decides, on
Evolution's records (sending.evidence), whether that send went out, before anything else it does (sending.worker's
before_the_call): SENT, not sent (the claim goes on to send, its lease renewed), or still unknown (asked again later,
or FAILED OUTCOME_UNKNOWN once the deadline or the attempt budget is gone).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from pilot_status import metrics

from .. import lifecycle
from ..models import EventKind, FailureReason, Message
from ..writes import TimelineLine
from . import evidence, lease
from .answers import note_id_honoured
from .lease import LEASE_LOST


def resolve_lost_answer(message: Message, token: uuid.UUID) -> str | None:
    """An earlier answer was lost: decide on Evolution's records (sending.evidence) whether that send
    went out. None: it did not, the lease is renewed and this claim may send; otherwise what was done."""
    verdict = evidence.judge(message)
    now = timezone.now()
    checked = {"verdict": verdict.kind, **({"why": verdict.why} if verdict.why else {}), **verdict.detail}
    if verdict.kind == evidence.TOO_SOON:
        # Not a retry and no wait of the message's own: asked again once Evolution has settled, even past deadline.
        at = datetime.fromisoformat(verdict.detail["at"])
        lifecycle.requeue(message, token, at, EventKind.WAITING,
                          detail={"why": "answer lost: Evolution is asked once it has settled", **verdict.detail})
        return "unknown"
    if verdict.kind == evidence.SENT:
        key = verdict.record["key"]
        if verdict.detail.get("by") == "ownId":
            note_id_honoured(message, message.instance, str(key["id"]))
        line = TimelineLine(
            EventKind.CHECKED, {**checked, "evolutionMessageId": key["id"],
                                "messageTimestamp": verdict.record.get("messageTimestamp")}, now,
        )
        try:
            with transaction.atomic():
                done = lifecycle.mark_sent(
                    message, token, str(key["id"]), str(key.get("remoteJid", "")),
                    {"outcome": "sent", "confirmedBy": "findMessages"}, attempt_line=line,
                ) or lifecycle.answer_after_receipts(
                    message, token, str(key["id"]), str(key.get("remoteJid", "")),
                    {"outcome": "sent", "confirmedBy": "findMessages"},
                )
        except IntegrityError:
            # Another message took that record meanwhile: it is not this one's to take.
            verdict = evidence.Verdict(evidence.UNKNOWN, why="the record became another message's meanwhile")
        else:
            return "confirmed_sent" if done else LEASE_LOST
    if verdict.kind == evidence.NOT_SENT:
        line = TimelineLine(EventKind.CHECKED, checked, now)
        if message.deliver_until <= now or message.attempts >= message.max_attempts:
            expired = message.deliver_until <= now
            message.record(line.kind, **line.detail)
            lifecycle.fail(
                message,
                FailureReason.EXPIRED if expired else FailureReason.RETRIES_EXHAUSTED,
                ("deliverUntil passed" if expired else f"{message.attempts} attempts failed")
                + "; the last attempt was not sent (findMessages)",
                message.last_gateway_response, lease_token=token, extra_update=dict(lifecycle.UNKNOWN_CLEARED),
            )
            return "failed"
        # The check took part of the lease: renew it for the send this claim goes on to make.
        if not lifecycle.settle_not_sent(message, token, timezone.now() + timedelta(seconds=lease.lease_seconds()), line):
            return LEASE_LOST
        return None
    return _stay_unknown(message, token, verdict, now)


def _stay_unknown(message: Message, token: uuid.UUID, verdict: evidence.Verdict, now: datetime) -> str:
    """Neither sent again nor marked sent: ask again later, or fail OUTCOME_UNKNOWN once the deadline
    or the attempt budget is gone."""
    since = message.outcome_unknown_since or now
    mark = {"outcome_unknown_since": since}
    metrics.messages(f"outcome_unknown:{message.lane}")
    if message.deliver_until <= now or message.attempts >= message.max_attempts:
        lifecycle.fail(
            message, FailureReason.OUTCOME_UNKNOWN,
            f"an answer from Evolution was lost and the message may have been delivered: {verdict.why}",
            {"outcome": "unknown", "why": verdict.why, **verdict.detail},
            lease_token=token, extra_update=mark,
        )
        return "outcome_unknown"
    # Ask again later (another message may claim a candidate, Evolution may come back): sooner at first.
    wait = timedelta(seconds=min(max(settings.UNCONFIRMED_SETTLE_SECONDS, (now - since).total_seconds()), 300))
    lifecycle.requeue(
        message, token, min(now + wait, message.deliver_until), EventKind.WAITING,
        detail={"why": "outcome of the last attempt unknown", "check": verdict.why, **verdict.detail},
        extra_update=mark,
    )
    return "unknown"
