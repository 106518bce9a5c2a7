"""The business logic of Evolution events. Idempotent, forward only, and it sets processed_at.

`apply(event)` returns an outcome word. A receipt finds its message by WhatsApp id: the one the message
chose for its sends (committed before the first attempt, so a receipt that overtakes sendText's answer
matches at once) or the one Evolution gave it. When neither is known yet (an Evolution that ignores our
id names the send by its own, which the worker records from the answer), the event stays unprocessed
and is applied as soon as the send is recorded (`apply_waiting_for`, on the domain's `message_sent`
signal) or, failing that, by the reconciler.

`ingest(channel, payload)` is the webhook's way in: store and apply in one transaction, so a new
event costs one commit (each commit is an fsync: the dominant cost of an event under load).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from messaging import exchanges, governor, lifecycle, opt_outs, writes
from messaging.models import DEFAULT_OPT_OUT_KEYWORDS, FailureReason, Instance, Message, Status
from messaging.prepared import prepared_cursor
from messaging.sending import instance_state

from . import inbox
from .models import IngestionEvent

log = logging.getLogger(__name__)

RECEIPT_STATUS = {
    "SERVER_ACK": Status.SERVER_ACK,
    "DELIVERY_ACK": Status.DELIVERED,
    "READ": Status.READ,
    "PLAYED": Status.READ,
}
CONNECTION_STATES = ("open", "connecting", "close")
WAITING = "waiting_for_message"
ALREADY_PROCESSED = "already_processed"
# A receipt whose message never shows up (sent from the phone, or by another system on the
# same instance) is closed after this long so the reconciler stops carrying it.
UNMATCHED_AFTER = timedelta(hours=1)


def apply(event: IngestionEvent) -> str:
    """Run the event's effect once and mark it processed (unless it must wait for its message)."""
    return _apply_locked(IngestionEvent.objects.filter(pk=event.pk)) or ALREADY_PROCESSED


def apply_saved(dedup_key: str, payload: dict[str, Any] | None = None) -> str | None:
    """`apply` for the row stored under `dedup_key` (a forward); None when there is no such row. With the
    forwarded `payload` (the saved row's event: the key is a hash of its event, instance and data), a receipt or
    send confirmation whose message is known is applied and marked in one statement."""
    if payload is not None:
        applied = _saved_in_one_statement(dedup_key, payload)
        if applied is not None:
            return applied
    return _apply_locked(IngestionEvent.objects.filter(dedup_key=dedup_key))


def ingest(channel: str, payload: dict[str, Any]) -> str:
    """Store the raw event (channel) and apply it, in one transaction; ALREADY_PROCESSED for a copy.

    The new row is ours until the commit: an uncommitted insert holds the unique key (a
    concurrent copy's insert waits for us, then finds it processed), so it is as good as the
    row lock `apply` takes. Two things differ from storing first and applying after:
    - a send committing while we looked for its message cannot see our row yet, so after
      committing a receipt that waits for its message we look once more (`_recheck`);
    - if the business logic fails with anything but a database error, the transaction is
      rolled back and the raw event is stored again, unprocessed, before the error goes on
      (the reconciler retries it, as when the effect failed after a separate insert).
    """
    applied = _in_one_statement(channel, payload)
    if applied is not None:
        return applied
    try:
        with transaction.atomic():
            event, created = inbox.record(channel, payload)
            if created:
                outcome = _finish(event)
            elif event.processed_at is not None:
                return ALREADY_PROCESSED
    except DatabaseError:
        raise
    except Exception:
        _keep_unprocessed(channel, payload)
        raise
    if not created:
        # Stored earlier and still unprocessed (waiting for its message, or its holder died).
        return apply(event)
    if outcome == WAITING:
        return _recheck(event)
    return outcome


# The usual new receipt or send confirmation (its message known, the event not stored yet): find
# the message, move it forward with its timeline line (a receipt), and store the event processed,
# all in one statement instead of a transaction of five or six round trips (BEGIN, insert, lookup,
# move, mark, COMMIT): these are nearly all of an Evolution's events (bench B2, B5). The message is
# moved only while the event is not in the inbox; a copy stored meanwhile by the other channel
# makes the insert do nothing, and that copy's own handling then finds the move done ("stale").
# `known` says whether the event was already stored (and processed) when the statement began.
_ONE_STATEMENT = """
WITH known AS (
    SELECT processed_at IS NOT NULL AS processed FROM evolution_ingestion_events WHERE dedup_key = %s
), target AS (
    SELECT m.id FROM messaging_message m JOIN messaging_instance i ON i.id = m.instance_id
     WHERE (m.evolution_message_id = %s AND m.evolution_message_id <> '' OR m.own_message_id = %s AND m.own_message_id <> '')
       AND i.name = %s AND NOT EXISTS (SELECT 1 FROM known)
       AND m.status NOT IN ('QUEUED', 'SENDING')  -- not answered yet: _receipt
     ORDER BY m.id LIMIT 1
), {move},
stored AS (
    INSERT INTO evolution_ingestion_events
        (dedup_key, channel, event, instance_name, key_id, payload, received_at, occurred_at,
         outcome, processed_at, forward_attempts, last_error)
    SELECT %s, %s, %s, %s, %s, %s::jsonb, now(), %s, {outcome}, now(), 0, ''
     WHERE EXISTS (SELECT 1 FROM target)
    ON CONFLICT (dedup_key) DO NOTHING
    RETURNING id
)
SELECT (SELECT processed FROM known), (SELECT id FROM stored), (SELECT category FROM changed)
"""
# A forwarded copy (handlers.apply_saved): the consumer stored the row unprocessed and holds the event's lock
# while it waits for our answer. The row is locked here as `_apply_locked` locks it (the reconciler, or a send's
# `apply_waiting_for`, may hold it); one that turns out processed meanwhile drops out, and the general path says so.
_SAVED_ONE_STATEMENT = """
WITH saved AS (
    SELECT id FROM evolution_ingestion_events WHERE dedup_key = %s AND processed_at IS NULL FOR UPDATE
), target AS (
    SELECT m.id FROM messaging_message m JOIN messaging_instance i ON i.id = m.instance_id
     WHERE (m.evolution_message_id = %s AND m.evolution_message_id <> '' OR m.own_message_id = %s AND m.own_message_id <> '')
       AND i.name = %s AND EXISTS (SELECT 1 FROM saved)
       AND m.status NOT IN ('QUEUED', 'SENDING')  -- not answered yet: _receipt
     ORDER BY m.id LIMIT 1
), {move},
finished AS (
    UPDATE evolution_ingestion_events SET outcome = {outcome}, processed_at = now()
     WHERE id = (SELECT id FROM saved) AND EXISTS (SELECT 1 FROM target)
    RETURNING id
)
SELECT (SELECT id FROM finished), (SELECT category FROM changed)
"""
_MOVED = "CASE WHEN EXISTS (SELECT 1 FROM changed) THEN 'applied' ELSE 'stale' END"
# A send confirmation changes nothing (the worker recorded SENT from sendText's answer).
_NO_MOVE = "changed AS (SELECT NULL::varchar AS category WHERE false)"


@dataclass(frozen=True)
class _Move:
    """What a receipt or send confirmation does to its message, as the CTEs of one statement."""
    event: str
    ctes: str  # `changed` (and `timeline`), reading the message's id from the `target` CTE
    params: list[Any]
    lines: list[Any]
    outcome: str  # SQL for the inbox row's outcome


def _move_of(payload: dict[str, Any]) -> _Move | None:
    """The move of a delivery receipt or send confirmation; None for any other event (the general path)."""
    event, data = payload.get("event"), payload.get("data")
    if not isinstance(data, dict):
        return None
    if event == "messages.update":
        status = RECEIPT_STATUS.get(str(data.get("status", "")))
        if status is None or data.get("fromMe") is False:
            return None
        # A message found by its own id before its send's answer was recorded takes that id as Evolution's.
        key_id = inbox.storable(inbox.key_id_of(payload)[:64])
        ctes, params, lines = lifecycle.advance_ctes("(SELECT id FROM target)", status, timezone.now(), key_id,
                                                     source="evolution", evolutionStatus=str(data["status"]))
        return _Move(event, ctes, params, lines, _MOVED)
    if event == "send.message":
        return _Move(event, _NO_MOVE, [], [], "'confirmed'")
    return None


def _outcome(move: _Move, category: Any) -> str:
    if category is not None:
        writes.count_timeline(move.lines, category)
    if move.event == "send.message":
        return "confirmed"
    return "applied" if category is not None else "stale"


def _saved_in_one_statement(dedup_key: str, payload: dict[str, Any]) -> str | None:
    """A forwarded receipt or send confirmation (stored unprocessed by the consumer) applied and marked in one
    statement; None when it needs the general path (processed already, its message unknown, another event)."""
    move = _move_of(payload)
    if move is None:
        return None
    key_id = inbox.storable(inbox.key_id_of(payload)[:64])  # as the row stored them (inbox.row_values)
    if not key_id:
        return None
    instance = inbox.storable(str(payload.get("instance"))[:100])
    with prepared_cursor() as cursor:
        cursor.execute(_SAVED_ONE_STATEMENT.format(move=move.ctes, outcome=move.outcome),
                       [dedup_key, key_id, key_id, instance, *move.params])
        finished_id, category = cursor.fetchone()
    return None if finished_id is None else _outcome(move, category)


def _in_one_statement(channel: str, payload: dict[str, Any]) -> str | None:
    """A delivery receipt or send confirmation applied and stored in one statement; None when it
    needs the general path (another event, its message unknown yet, or stored but not processed)."""
    move = _move_of(payload)
    if move is None:
        return None
    row = inbox.row_values(channel, payload)
    if not row["key_id"]:
        return None
    params = [row["key"], row["key_id"], row["key_id"], row["instance"], *move.params, row["key"], row["channel"], row["event"],
              row["instance"], row["key_id"], row["payload"], row["occurred_at"]]
    with prepared_cursor() as cursor:
        cursor.execute(_ONE_STATEMENT.format(move=move.ctes, outcome=move.outcome), params)
        known_processed, stored_id, category = cursor.fetchone()
    if known_processed:
        return ALREADY_PROCESSED
    if stored_id is None:
        # Unknown message (the send is not committed yet: it waits in the inbox), an event stored
        # but not processed, or a copy stored by the other channel while this statement ran.
        if category is not None:
            writes.count_timeline(move.lines, category)
            return "applied"
        return None
    return _outcome(move, category)


def _keep_unprocessed(channel: str, payload: dict[str, Any]) -> None:
    try:
        inbox.record(channel, payload)
    except Exception:
        log.exception("could not keep the raw event after its handler failed")


def _recheck(event: IngestionEvent) -> str:
    """A receipt committed as waiting: its send may have committed while we looked (and then
    not seen our uncommitted row). Any send committing after this look will see the row."""
    if _message_for(event) is None:
        return WAITING
    return apply(event)


def _apply_locked(rows: QuerySet[IngestionEvent]) -> str | None:
    with transaction.atomic():
        # The row lock serialises both channels and the reconciler on one event, even with
        # Redis down; processed_at is re-read under it. The row was committed before this,
        # so a send committing meanwhile finds it and waits here for us (apply_waiting_for).
        locked = rows.select_for_update().first()
        if locked is None:
            return None
        if locked.processed_at is not None:
            return ALREADY_PROCESSED
        return _finish(locked)


_FINISHED = "UPDATE evolution_ingestion_events SET outcome = %(outcome)s, processed_at = %(processed_at)s WHERE id = %(id)s"
_ANY_WAITING = "SELECT EXISTS (SELECT 1 FROM evolution_ingestion_events WHERE key_id = %(key_id)s AND key_id <> '' AND processed_at IS NULL)"


def _finish(event: IngestionEvent) -> str:
    """The effect, then the row's outcome and processed_at (the caller holds the row)."""
    outcome = _effect(event)
    if outcome == WAITING and timezone.now() - event.received_at > UNMATCHED_AFTER:
        outcome = "unmatched"
    event.outcome = outcome
    if outcome != WAITING:
        event.processed_at = timezone.now()
    with prepared_cursor() as cursor:  # every new event passes here: one prepared statement
        cursor.execute(_FINISHED, {"outcome": event.outcome, "processed_at": event.processed_at, "id": event.pk})
    return outcome


def _effect(event: IngestionEvent) -> str:
    payload = event.payload if isinstance(event.payload, dict) else {}
    raw_data = payload.get("data")
    data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
    # The instance is read only where it is needed: a receipt finds its message by keyId and
    # instance name in one query, and looks for the instance only when no message matched.
    if event.event == "messages.update":
        return _receipt(event, data)
    if event.event == "send.message":
        return _confirm_send(event)
    if event.event == "connection.update":
        instance = Instance.objects.filter(name=event.instance_name).first()
        if instance is None:
            return "unknown_instance"
        return _connection(event, instance, data)
    if event.event == "messages.upsert":
        return _inbound(event, data)
    # messages.delete, contacts.*, chats.*, ...: kept in the inbox, no effect.
    return "stored"


def _inbound(event: IngestionEvent, data: dict[str, Any]) -> str:
    """A message someone wrote to one of our instances: an opt-out keyword revokes their opt-in
    (messaging.opt_outs); anything else is only kept in the inbox."""
    key = data.get("key")
    if not isinstance(key, dict) or key.get("fromMe") is not False:
        return "stored"  # our own sends (or typed on the phone) and odd shapes
    text = inbound_text(data.get("message"))
    if text is None:
        return "stored"
    phone, why = sender_phone(key, data)
    if phone is None:
        if why and opt_outs.could_be_keyword(text) and opt_outs.is_opt_out(text, DEFAULT_OPT_OUT_KEYWORDS + _project_keywords(event.instance_name)):
            log.warning("opt-out keyword on %s not applied: %s (inbox %s)", event.instance_name, why, event.pk)
            return "opt_out_sender_unknown"
        return "stored"
    # The sender is no cold contact of this number any more (the sending policy's quota, the sticky sender).
    exchanges.received(event.instance_name, phone, event.occurred_at or timezone.now())
    return opt_outs.on_inbound(opt_outs.Inbound(event.instance_name, phone, text, f"inbox:{event.pk}"))


def _project_keywords(instance_name: str) -> list[str]:
    keywords = Instance.objects.filter(name=instance_name).values_list("project__opt_out_keywords", flat=True).first()
    return list(keywords or [])


def inbound_text(message: Any) -> str | None:
    """The text of an inbound message (plain or extended), or None for media, reactions and the like."""
    if not isinstance(message, dict):
        return None
    text = message.get("conversation")
    if not isinstance(text, str):
        extended = message.get("extendedTextMessage")
        text = extended.get("text") if isinstance(extended, dict) else None
    return text if isinstance(text, str) else None


_PHONE_JID = "@s.whatsapp.net"


def _jid_phone(jid: Any) -> str | None:
    if not isinstance(jid, str) or not jid.endswith(_PHONE_JID):
        return None
    digits = jid[: -len(_PHONE_JID)].split(":", 1)[0]  # a device suffix `:NN` is not part of the number
    return opt_outs.phone_from_digits(digits) if digits.isdigit() and len(digits) <= 15 else None


def sender_phone(key: dict[str, Any], data: dict[str, Any]) -> tuple[str | None, str]:
    """The sender's E.164 number from Evolution's jids, or None and why not.

    `remoteJid` is `<digits>@s.whatsapp.net`, or in Evolution 2.3.7 / Baileys 7 an `@lid` id that says
    nothing about the number: then `remoteJidAlt` or `senderPn` carry the phone jid when present."""
    jid = key.get("remoteJid")
    if isinstance(jid, str) and jid.endswith("@lid"):
        for alt in (key.get("remoteJidAlt"), key.get("senderPn"), data.get("senderPn")):
            phone = _jid_phone(alt)
            if phone is not None:
                return phone, ""
        return None, f"the sender is {jid} (a LID) and no remoteJidAlt or senderPn gives its number"
    if isinstance(jid, str) and not jid.endswith(_PHONE_JID):
        return None, ""  # a group, a broadcast list, status@broadcast: not one person's consent
    phone = _jid_phone(jid)
    return (phone, "") if phone is not None else (None, f"the sender's jid {str(jid)[:80]!r} is not a valid number")


def _message_for(event: IngestionEvent) -> Message | None:
    # Matched on keyId only (plus the instance): in Evolution 2.3.7 remoteJid may be an @lid
    # id that says nothing about the number we sent to.
    if not event.key_id:
        return None
    return writes.message_by_evolution_id(event.key_id, event.instance_name)


def _no_message(event: IngestionEvent) -> str:
    """No message matched: wait for its send, unless the instance itself is unknown."""
    if not Instance.objects.filter(name=event.instance_name).exists():
        return "unknown_instance"
    return WAITING


def _receipt(event: IngestionEvent, data: dict[str, Any]) -> str:
    if data.get("fromMe") is False:
        return "ignored_inbound"
    status = str(data.get("status", ""))
    if status != "ERROR" and status not in RECEIPT_STATUS:
        return "ignored_status"  # PENDING, DELETED, EDITED: no delivery progress
    message = _message_for(event)
    if message is None:
        return _no_message(event)
    if status == "ERROR":
        # SENDING: matched on the message's own id, the error overtook sendText's answer.
        failed = lifecycle.fail(
            message,
            FailureReason.REJECTED,
            "WhatsApp reported an error for this message",
            response={"event": "messages.update", "status": "ERROR", "keyId": event.key_id},
            from_statuses=(Status.SENDING, Status.SENT, Status.SERVER_ACK),
            extra_update={"evolution_message_id": message.evolution_message_id or event.key_id},
        )
        if failed:
            # WhatsApp's 463 (the reach-out time-lock) comes as this error: on a cold contact, a strike for the number.
            governor.safely(governor.error_receipt, message)
        return "failed" if failed else "stale"
    for _ in range(2):  # once more if its status changed under us (answered meanwhile, a requeue): advance reads it
        if lifecycle.advance(message, RECEIPT_STATUS[status], key_id=event.key_id, source="evolution",
                             evolutionStatus=status):
            return "applied"
        seen = message.status
        message.refresh_from_db(fields=["status"])
        if message.status == seen:
            break
    return "stale"


def _confirm_send(event: IngestionEvent) -> str:
    # The worker already recorded SENT from sendText's answer; this event confirms the id
    # (and, arriving first, waits for that commit like any early receipt).
    return _no_message(event) if _message_for(event) is None else "confirmed"


def _connection(event: IngestionEvent, instance: Instance, data: dict[str, Any]) -> str:
    state = data.get("state")
    if state not in CONNECTION_STATES:
        return "ignored_state"  # e.g. "refused" (QR limit): not a connection state
    # Serialise connection events of one instance, so that the "is a newer one applied?"
    # check and the write cannot interleave between two channels. FOR NO KEY UPDATE: a plain
    # FOR UPDATE would also block the foreign-key checks of every accept for this instance.
    Instance.objects.select_for_update(no_key=True).filter(pk=instance.pk).first()
    if event.occurred_at is not None and _newer_state_applied(event):
        return "stale"
    # The domain records it, refreshes the worker's cached view and, on `open`, releases the
    # messages that were smart-waiting for this instance (paced by the relay). The cached view is
    # written once the state commits: a Redis round trip here would keep this transaction, the
    # instance row's lock and the new inbox row's with it, open for as long as Redis takes.
    transaction.on_commit(lambda: instance_state.remember(instance.name, str(state)))
    changed = instance_state.sync(instance, str(state))
    # Leaving open is a disconnect, a close 401 a logout, a close 403 a ban: the number's health (messaging.governor).
    governor.safely(governor.connection, instance, str(state), data.get("statusReason"), changed)
    return "state_changed" if changed else "state_unchanged"


def _newer_state_applied(event: IngestionEvent) -> bool:
    """A later connection.update already set the state: this one arrived late (other channel, retry)."""
    return (
        IngestionEvent.objects.filter(
            event="connection.update",
            instance_name=event.instance_name,
            processed_at__isnull=False,
            occurred_at__gt=event.occurred_at,
        )
        .exclude(outcome__in=("stale", "ignored_state"))
        .exists()
    )


def apply_waiting_for(key_id: str) -> int:
    """Apply receipts that arrived before their message's send was committed."""
    with prepared_cursor() as cursor:  # after every send: almost always none, so ask cheaply first
        cursor.execute(_ANY_WAITING, {"key_id": key_id})
        row = cursor.fetchone()
    if not (row and row[0]):
        return 0
    applied = 0
    for event in IngestionEvent.objects.filter(key_id=key_id, processed_at__isnull=True).order_by("received_at", "pk"):
        if apply(event) not in (WAITING, ALREADY_PROCESSED):
            applied += 1
    return applied


def on_message_sent(sender: Any, message: Message, **kwargs: Any) -> None:
    if not message.evolution_message_id:
        return
    try:
        apply_waiting_for(message.evolution_message_id)
    except Exception:  # the reconciler applies them later; never fail the send for this
        log.exception("could not apply early receipts for %s", message.pk)


lifecycle.message_sent.connect(on_message_sent, dispatch_uid="ingestion.apply_early_receipts")
