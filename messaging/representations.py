"""JSON shapes of domain objects shared by the API and the accept funnel (stored idempotent answers)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .models import DeadLetter, Message, MessageEvent


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def accepted_body(message: Message) -> dict[str, Any]:
    return {
        "id": str(message.id),
        "status": message.status,
        "category": message.category,
        "to": message.to,
        "instance": message.instance.name,
        "deliverUntil": iso(message.deliver_until),
        "createdAt": iso(message.created_at),
    }


def event_body(event: MessageEvent) -> dict[str, Any]:
    return {
        "type": event.kind,
        "at": iso(event.created_at),
        "actor": event.actor or None,
        "detail": event.detail,
    }


def waiting_reason(message: Message) -> str | None:
    if message.status != "QUEUED" or not message.hold_reason:
        return None
    return message.hold_reason.split("|")[0] or None


def message_body(message: Message, events: list[MessageEvent] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(message.id),
        "status": message.status,
        "failureReason": message.failure_reason or None,
        "failureDetail": message.failure_detail or None,
        "category": message.category,
        "priority": message.priority,
        "typing": message.typing,
        "environment": message.environment,
        "to": message.to,
        "text": message.text,
        "instance": message.instance.name,
        "attempts": message.attempts,
        "maxAttempts": message.max_attempts,
        "evolutionMessageId": message.evolution_message_id or None,
        # An answer from Evolution was lost and its records could not tell whether it was sent:
        # the message may have been delivered (FAILED OUTCOME_UNKNOWN, or still being checked).
        "outcomeUnknown": message.outcome_unknown,
        "outcomeUnknownSince": iso(message.outcome_unknown_since),
        # SENT, and WhatsApp never acknowledged it within ACK_TIMEOUT_SECONDS (messaging.unacknowledged).
        "unacknowledged": message.unacknowledged,
        "unacknowledgedAt": iso(message.unacknowledged_at),
        "metadata": message.metadata,
        # The URL the send asked for its own `message.status` callbacks (callbacks.derive); null without.
        "callbackUrl": message.callback_url or None,
        "deliverUntil": iso(message.deliver_until),
        "nextAttemptAt": iso(message.next_attempt_at) if message.status == "QUEUED" else None,
        # What holds a queued message back (its WAITING line's `why`): the sending policy's `pacing`, `hourly_cap`,
        # `daily_cap`, `warming_up`, `resting`, or a wait of the gateway's; null when nothing does.
        "waitingReason": waiting_reason(message),
        "createdAt": iso(message.created_at),
        "updatedAt": iso(message.updated_at),
        "sentAt": iso(message.sent_at),
        "serverAckAt": iso(message.server_ack_at),
        "deliveredAt": iso(message.delivered_at),
        "readAt": iso(message.read_at),
        "failedAt": iso(message.failed_at),
    }
    if events is not None:
        body["events"] = [event_body(e) for e in events]
    return body


def dead_letter_body(entry: DeadLetter) -> dict[str, Any]:
    return {
        "id": entry.pk,
        "messageId": str(entry.message_id),
        "reason": entry.reason,
        "detail": entry.detail,
        "lastGatewayResponse": entry.last_gateway_response,
        "attempts": entry.attempts,
        "status": entry.status,
        "resolvedBy": entry.resolved_by or None,
        "resolvedAt": iso(entry.resolved_at),
        "createdAt": iso(entry.created_at),
        "category": entry.message.category,
        "to": entry.message.to,
        "outcomeUnknown": entry.message.outcome_unknown,
    }
