"""The business logic of Evolution events. Idempotent, forward only, and it sets processed_at.

`apply(event)` returns an outcome word; when the message a receipt talks about is not known
yet (the ack raced ahead of the worker's commit), the event stays unprocessed and is applied
as soon as the send is recorded (`apply_waiting_for`) or by the reconciler.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from messaging import lifecycle
from messaging.models import FailureReason, Instance, Message, Status
from pilot_status import metrics

from .models import IngestionEvent

log = logging.getLogger(__name__)

RECEIPT_STATUS = {
    "SERVER_ACK": Status.SERVER_ACK,
    "DELIVERY_ACK": Status.DELIVERED,
    "READ": Status.READ,
    "PLAYED": Status.READ,
}
WAITING = "waiting_for_message"
# A receipt whose message never shows up (sent from the phone, or from another system on the
# same instance) is closed after this long so the reconciler stops carrying it.
UNMATCHED_AFTER = timedelta(hours=1)


def apply(event: IngestionEvent) -> str:
    """Run the event's effect once and mark it processed (unless it must wait for its message)."""
    with transaction.atomic():
        locked = IngestionEvent.objects.select_for_update().get(pk=event.pk)
        if locked.processed_at is not None:
            return "already_processed"
        outcome = _effect(locked)
        if outcome == WAITING and timezone.now() - locked.received_at > UNMATCHED_AFTER:
            outcome = "unmatched"
        locked.outcome = outcome
        if outcome != WAITING:
            locked.processed_at = timezone.now()
        locked.save(update_fields=["outcome", "processed_at"])
    return outcome


def _effect(event: IngestionEvent) -> str:
    payload = event.payload if isinstance(event.payload, dict) else {}
    data = payload.get("data") if isinstance(payload.get("data"), dict) else {}
    name = event.event
    if name == "messages.update":
        return _receipt(event, data)
    if name == "send.message":
        return _confirm_send(event, data)
    if name == "connection.update":
        return _connection(event, data)
    return "stored"


def _message_for(event: IngestionEvent) -> Message | None:
    if not event.key_id:
        return None
    rows = Message.objects.filter(evolution_message_id=event.key_id)
    if event.instance_name:
        rows = rows.filter(instance__name=event.instance_name)
    return rows.first()


def _receipt(event: IngestionEvent, data: dict[str, Any]) -> str:
    if data.get("fromMe") is False:
        return "ignored_inbound"
    status = str(data.get("status", ""))
    message = _message_for(event)
    if message is None:
        return WAITING
    if status == "ERROR":
        failed = lifecycle.fail(
            message,
            FailureReason.REJECTED,
            "WhatsApp reported an error for this message",
            response={"event": "messages.update", "status": "ERROR"},
            from_statuses=(Status.SENT, Status.SERVER_ACK),
        )
        return "failed" if failed else "stale"
    target = RECEIPT_STATUS.get(status)
    if target is None:
        return "ignored_status"
    if message.advance(target, source="evolution", evolutionStatus=status):
        metrics.messages(f"status:{target}:{message.lane}")
        return "applied"
    return "stale"


def _confirm_send(event: IngestionEvent, data: dict[str, Any]) -> str:
    message = _message_for(event)
    return WAITING if message is None else "confirmed"


def _connection(event: IngestionEvent, data: dict[str, Any]) -> str:
    state = data.get("state")
    if state not in ("open", "connecting", "close"):
        return "ignored_state"
    instance = Instance.objects.filter(name=event.instance_name).first()
    if instance is None:
        return "unknown_instance"
    changed = instance.set_connection_state(state)
    if changed and state == "open":
        _release_waiting(instance)
    return "state_changed" if changed else "state_unchanged"


def _release_waiting(instance: Instance) -> None:
    """A reconnect makes the instance's waiting messages due now; the relay paces them out."""
    from messaging.models import OutboxEntry

    now = timezone.now()
    OutboxEntry.objects.filter(
        message__instance=instance, message__status=Status.QUEUED, available_at__gt=now
    ).update(available_at=now)


def apply_waiting_for(key_id: str) -> int:
    """Apply receipts that arrived before their message's send was committed."""
    applied = 0
    for event in IngestionEvent.objects.filter(key_id=key_id, processed_at__isnull=True).order_by("received_at", "pk"):
        if apply(event) != WAITING:
            applied += 1
    return applied


def on_message_sent(sender: Any, message: Message, **kwargs: Any) -> None:
    try:
        apply_waiting_for(message.evolution_message_id)
    except Exception:  # the reconciler applies them later; never fail the send for this
        log.exception("could not apply early receipts for %s", message.pk)


lifecycle.message_sent.connect(on_message_sent, dispatch_uid="ingestion.apply_early_receipts")
