"""The JSON bodies of the relay pass's events (message.status, message.inbound, message.unacknowledged,
instance.health), built from a source row's values: what an endpoint receives. opt_in.revoked's three fields
are written where its deliveries are (callbacks.derive_events)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from messaging.models import EventKind, Status

from .models import EventType

_PHONE_JID = re.compile(r"^(\d{6,20})@s\.whatsapp\.net$")


def status_payload(event_id: int, kind: str, message_id: Any, to: str, metadata: Any, detail: dict[str, Any], at: datetime) -> dict[str, Any]:
    if kind == EventKind.FAILED:
        status, reason = Status.FAILED.value, str(detail.get("reason") or "")
    elif kind == EventKind.RESENT:
        status, reason = Status.QUEUED.value, ""
    else:
        status, reason = str(detail.get("status") or ""), ""
    return {
        "type": EventType.MESSAGE_STATUS.value,
        "timestamp": at.isoformat(),
        "data": {
            "messageId": str(message_id),
            "status": status,
            "statusAt": at.isoformat(),
            # The timeline line's id: it grows with every change of one message, so a receiver
            # keeps the highest it has seen and drops a stale one that arrives late.
            "sequence": event_id,
            "failureReason": reason or None,
            "to": to,
            "metadata": metadata or {},
        },
    }


def inbound_payload(instance: str, key_id: str, data: dict[str, Any], at: datetime) -> dict[str, Any]:
    key = data.get("key") or {}
    jid = str(key.get("remoteJid") or "")
    phone = _PHONE_JID.match(jid)
    found = data.get("message")
    message: dict[str, Any] = found if isinstance(found, dict) else {}
    text = message.get("conversation") or (message.get("extendedTextMessage") or {}).get("text") or ""
    return {
        "type": EventType.MESSAGE_INBOUND.value,
        "timestamp": at.isoformat(),
        "data": {
            "instance": instance,
            "from": f"+{phone.group(1)}" if phone else None,
            "remoteJid": jid,
            "pushName": data.get("pushName") if isinstance(data.get("pushName"), str) else None,
            "text": str(text)[:4096],
            "whatsappMessageId": key_id,
            "receivedAt": at.isoformat(),
        },
    }


def unacknowledged_payload(message_id: Any, to: str, metadata: Any, sent_at: datetime, at: datetime,
                           instance: str, timeout_seconds: int) -> dict[str, Any]:
    return {
        "type": EventType.MESSAGE_UNACKNOWLEDGED.value,
        "timestamp": at.isoformat(),
        "data": {
            "messageId": str(message_id),
            "status": Status.SENT.value,
            "sentAt": sent_at.isoformat(),
            "unacknowledgedAt": at.isoformat(),
            "ackTimeoutSeconds": timeout_seconds,
            "instance": instance,
            "to": to,
            "metadata": metadata or {},
        },
    }


def health_payload(change_id: int, instance: str, from_state: str, to_state: str, reason: str, evidence: Any,
                   actor: str, cold_paused_until: datetime | None, at: datetime) -> dict[str, Any]:
    return {
        "type": EventType.INSTANCE_HEALTH.value,
        "timestamp": at.isoformat(),
        "data": {
            "instance": instance,
            "state": to_state,
            "previousState": from_state,
            "reason": reason,
            "evidence": evidence or {},
            # Who moved it: the governor, or an operator (whose name stays in admin).
            "by": "operator" if actor.startswith("operator:") else "governor",
            "coldContactsPausedUntil": cold_paused_until.isoformat() if cold_paused_until else None,
            "changedAt": at.isoformat(),
            # Grows with each change: keep the highest, drop a lower one that arrives late.
            "sequence": change_id,
        },
    }
