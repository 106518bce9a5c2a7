"""Did a send whose answer was lost go out? Decided on evidence only (issue 22).

An answer lost after the request left (a read timeout, a reset, a worker that died with its lease)
leaves the message's outcome open. Evolution's records (findMessages) are the evidence, and a record
proves *this* message's send only when it can belong to no other message:
- its WhatsApp id is not already another message's (the database enforces one message per id and
  instance, `msg_evolution_id_once`);
- it is stamped inside this attempt's own window (from just before the attempt started to its end,
  `UNCONFIRMED_CLOCK_SKEW_SECONDS` either side);
- it is to this recipient under any of its jids (`@s.whatsapp.net` or its `@lid`) and has this text;
- no other message to the same number with the same text could have made it: none of them is being
  sent right now, and none has a lost answer of its own whose window holds the record.
Exactly one such record: SENT with its id. None: the send did not go out (Evolution saves every
message it sends, docs/evolution-setup.md), so it may be sent again. Anything else (several records,
a record another message may own, Evolution cannot be asked) is UNKNOWN: the message is neither
sent again nor marked sent, and fails OUTCOME_UNKNOWN if its deadline or budget runs out so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from pilot_status.database import release_while_waiting

from ..models import Message, Status
from . import gateway

SENT = "sent"
NOT_SENT = "not_sent"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Verdict:
    kind: str
    record: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def window(started: datetime, ended: datetime) -> tuple[datetime, datetime]:
    """An attempt's window as stored on the message: its start and end with the clock skew added."""
    skew = timedelta(seconds=settings.UNCONFIRMED_CLOCK_SKEW_SECONDS)
    return started - skew, ended + skew


def judge(message: Message, now: datetime | None = None) -> Verdict:
    assert message.unconfirmed_attempt_at is not None
    since = message.unconfirmed_attempt_at
    until = message.unconfirmed_attempt_until or (now or timezone.now())
    instance_name = message.instance.name
    release_while_waiting()  # Evolution's answer can take seconds: the pooled connection serves others meanwhile
    try:
        records = gateway.find_sent_candidates(
            instance_name, message.to, message.text, since.timestamp(), until.timestamp()
        )
    except gateway.CannotTell as exc:
        return Verdict(UNKNOWN, why="Evolution could not be asked", detail={"error": str(exc)[:300]})
    ids = [str(record["key"]["id"]) for record in records]
    claimed = set(
        # `<> ''` spelled out so that the partial unique index (msg_evolution_id_once) serves it.
        Message.objects.filter(instance_id=message.instance_id, evolution_message_id__in=ids)
        .exclude(evolution_message_id="")
        .exclude(pk=message.pk)
        .values_list("evolution_message_id", flat=True)
    )
    free = [record for record in records if record["key"]["id"] not in claimed]
    if not free:
        return Verdict(NOT_SENT, detail={"recordsOfOtherMessages": len(records)} if records else {})
    if len(free) > 1:
        return Verdict(UNKNOWN, why="several records may be this message's", detail={"candidates": [r["key"]["id"] for r in free]})
    record = free[0]
    rival = _rival(message, datetime.fromtimestamp(int(record["messageTimestamp"]), tz=since.tzinfo))
    if rival is not None:
        return Verdict(
            UNKNOWN, why="another message to this number with the same text may own the record",
            detail={"candidate": record["key"]["id"], "otherMessage": str(rival)},
        )
    return Verdict(SENT, record=record)


def _rival(message: Message, stamped: datetime) -> Any:
    """Another message with the same recipient and text that may have made a record stamped then:
    one being claimed right now, or one whose own lost answer's window holds it (whole seconds)."""
    same = Message.objects.filter(instance_id=message.instance_id, to=message.to).exclude(pk=message.pk)
    lost = same.filter(
        Q(unconfirmed_attempt_until__isnull=True) | Q(unconfirmed_attempt_until__gte=stamped),
        unconfirmed_attempt_at__isnull=False,
        unconfirmed_attempt_at__lte=stamped + timedelta(seconds=1),
        text=message.text,
    )
    in_flight = same.filter(status=Status.SENDING, text=message.text)
    for rows in (lost, in_flight):
        found = rows.values_list("pk", flat=True).first()
        if found is not None:
            return found
    return None
