"""Did a send whose answer was lost go out? Decided on evidence only (issues 22, 48).

An answer lost after the request left (a read timeout, a reset, a worker that died with its lease)
leaves the message's outcome open. Evolution's records (findMessages) are the evidence.

**By our id.** Every send carries the WhatsApp id the message chose (sending.own_id, Evolution's
`messageId`), so the first question is exact: is there a record with that id?
- found: SENT with it, whatever its text (nothing else carries that id);
- not found, on an instance known to send with our ids (`Instance.honours_message_id`), once the gateway's
  settle time has passed since the attempt (`UNCONFIRMED_SETTLE_SECONDS`, after which Evolution no longer
  sends for a request we gave up on): NOT SENT, and the message is sent again with the same id; sooner, it is
  asked again at that time (TOO_SOON);
- Evolution cannot be asked: UNKNOWN.

**By inference**, only on an instance not known to honour our ids (an older Evolution ignores `messageId`, and
until an answer shows which it is), and for messages that never chose an id. A record proves *this*
message's send only when it can belong to no other message and no other sender:
- it came from Evolution's own sendText, not from the account's phone or another linked device
  (`from_the_api`: docs/evolution-setup.md, "Our WhatsApp id on every send");
- its WhatsApp id is not already another message's (the database enforces one message per id and
  instance, `msg_evolution_id_once`);
- it is stamped inside this attempt's own window (from just before the attempt started to its end,
  `UNCONFIRMED_CLOCK_SKEW_SECONDS` either side);
- it is to this recipient under any of its jids (`@s.whatsapp.net` or its `@lid`) and has this text;
- no other message to the same number with the same text could have made it: none of them is being
  sent right now, and none has a lost answer of its own whose window holds the record.
Exactly one such record: SENT with its id. None at all with this text (from the API or not): the send did not
go out (Evolution saves every message it sends, docs/evolution-setup.md), so it may be sent again. Anything
else (several records, a record another message or sender may own, Evolution cannot be asked) is UNKNOWN: the
message is neither sent again nor marked sent, and fails OUTCOME_UNKNOWN if its deadline or budget runs out so.
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
from . import gateway, own_id

SENT = "sent"
NOT_SENT = "not_sent"
UNKNOWN = "unknown"
TOO_SOON = "too_soon"  # not found by our id yet, but Evolution may still be sending it: ask at `detail["at"]`


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


def settled_at(until: datetime) -> datetime:
    """When Evolution can no longer be sending for a lost attempt whose window ends `until`: the attempt's end
    (the window's, less the clock skew `window` added), then the gateway's settle time."""
    return until + timedelta(seconds=settings.UNCONFIRMED_SETTLE_SECONDS - settings.UNCONFIRMED_CLOCK_SKEW_SECONDS)


def judge(message: Message, now: datetime | None = None) -> Verdict:
    assert message.unconfirmed_attempt_at is not None
    now = now or timezone.now()
    release_while_waiting()  # Evolution's answer can take seconds: the pooled connection serves others meanwhile
    if message.own_message_id:
        try:
            found = gateway.find_by_id(message.instance.name, message.own_message_id)
        except gateway.CannotTell as exc:
            return Verdict(UNKNOWN, why="Evolution could not be asked", detail={"error": str(exc)[:300]})
        if found:
            return Verdict(SENT, record=found[0], detail={"by": "ownId"})
        if message.instance.honours_message_id:
            at = settled_at(message.unconfirmed_attempt_until or message.unconfirmed_attempt_at)
            if now < at:
                return Verdict(TOO_SOON, why="not found by our id yet: Evolution may still be sending it",
                               detail={"by": "ownId", "at": at.isoformat()})
            return Verdict(NOT_SENT, detail={"by": "ownId"})
    return _inferred(message, now)


def from_the_api(record: dict[str, Any]) -> bool:
    """Whether a record shows that Evolution's own sendText made it, not the account's phone or another device
    linked to it (both reach Evolution as messages.upsert with fromMe true, and it files them alike):
    - its id has the shape Baileys gives Evolution's sends ("3EB0" + 18 hex), and its `source` is `web`, which
      Evolution derives from that id (an Android, iPhone or desktop app's ids read as those);
    - its status history (`MessageUpdate`) holds a SERVER_ACK: WhatsApp's server acknowledges a message to the
      device that sent it, so only this Evolution's own sends get one (a message typed on WhatsApp Web, whose id
      and source look like ours, gets only the contact's receipts)."""
    key: dict[str, Any] = record["key"] if isinstance(record.get("key"), dict) else {}
    updates = record.get("MessageUpdate")
    acked = isinstance(updates, list) and any(isinstance(u, dict) and u.get("status") == "SERVER_ACK" for u in updates)
    return own_id.baileys_shaped(key.get("id")) and record.get("source") == "web" and acked


def _inferred(message: Message, now: datetime) -> Verdict:
    """The lost answer judged on number, text and window (issue 22), for an instance not known to honour our ids."""
    assert message.unconfirmed_attempt_at is not None
    since = message.unconfirmed_attempt_at
    until = message.unconfirmed_attempt_until or now
    try:
        every = gateway.find_sent_candidates(
            message.instance.name, message.to, message.text, since.timestamp(), until.timestamp()
        )
    except gateway.CannotTell as exc:
        return Verdict(UNKNOWN, why="Evolution could not be asked", detail={"error": str(exc)[:300]})
    # Records another message already owns (its answer carried the id) are that message's, acked yet or not.
    claimed = set(
        # `<> ''` spelled out so that the partial unique index (msg_evolution_id_once) serves it.
        Message.objects.filter(instance_id=message.instance_id,
                               evolution_message_id__in=[str(record["key"]["id"]) for record in every])
        .exclude(evolution_message_id="")
        .exclude(pk=message.pk)
        .values_list("evolution_message_id", flat=True)
    )
    records = [record for record in every if from_the_api(record)]
    if len(records) < len(every):
        # A twin typed on the phone says nothing about our send; one that may be ours but shows no server ack
        # (not acknowledged yet, or typed on WhatsApp Web) leaves the outcome open.
        ours = [r["key"]["id"] for r in every if not from_the_api(r) and own_id.baileys_shaped(r["key"]["id"])
                and r.get("source") == "web" and r["key"]["id"] not in claimed]
        if ours:
            return Verdict(UNKNOWN, why="a record with this text shows no server ack: it may be this message's or "
                           "another device's", detail={"candidates": ours})
    free = [record for record in records if record["key"]["id"] not in claimed]
    if not free:
        detail = {"recordsOfOtherMessages": len(records)} if records else {}
        if len(every) > len(records):
            detail["recordsFromOtherDevices"] = len(every) - len(records)
        return Verdict(NOT_SENT, detail=detail)
    if len(free) > 1:
        return Verdict(UNKNOWN, why="several records may be this message's", detail={"candidates": [r["key"]["id"] for r in free]})
    record = free[0]
    rival = _rival(message, datetime.fromtimestamp(int(record["messageTimestamp"]), tz=since.tzinfo))
    if rival is not None:
        return Verdict(
            UNKNOWN, why="another message to this number with the same text may own the record",
            detail={"candidate": record["key"]["id"], "otherMessage": str(rival)},
        )
    return Verdict(SENT, record=record, detail={"by": "inference"})


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
