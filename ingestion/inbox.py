"""The inbox: a stable dedup key per Evolution event, and an insert that is safe from both channels."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import connection

from .models import IngestionEvent


def dedup_key(payload: dict[str, Any]) -> str:
    """SHA-256 of what identifies the event, not of how it travelled.

    `date_time`, `destination`, `server_url` and `apikey` differ between the webhook and the
    RabbitMQ copy of one event (or between Evolution's retries), so they are left out.
    """
    identity = {
        "event": payload.get("event"),
        "instance": payload.get("instance"),
        "data": payload.get("data"),
    }
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def key_id_of(payload: dict[str, Any]) -> str:
    data = payload.get("data")
    if not isinstance(data, dict):
        return ""
    if isinstance(data.get("keyId"), str):
        return data["keyId"]
    key = data.get("key")
    if isinstance(key, dict) and isinstance(key.get("id"), str):
        return key["id"]
    if payload.get("event") == "messages.delete" and isinstance(data.get("id"), str):
        return data["id"]
    return ""


def is_evolution_event(payload: Any) -> bool:
    return (
        isinstance(payload, dict)
        and isinstance(payload.get("event"), str)
        and bool(payload["event"])
        and isinstance(payload.get("instance"), str)
        and "data" in payload
    )


def record(channel: str, payload: dict[str, Any]) -> tuple[IngestionEvent, bool]:
    """Store the raw event once; returns (row, created). Concurrent channels meet at the unique key."""
    key = dedup_key(payload)
    stored = {k: v for k, v in payload.items() if k != "already_saved"}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO evolution_ingestion_events
                (dedup_key, channel, event, instance_name, key_id, payload, received_at,
                 outcome, forward_attempts, last_error)
            VALUES (%s, %s, %s, %s, %s, %s::jsonb, now(), '', 0, '')
            ON CONFLICT (dedup_key) DO NOTHING
            RETURNING id
            """,
            [
                key,
                channel,
                str(payload.get("event"))[:64],
                str(payload.get("instance"))[:100],
                key_id_of(payload)[:64],
                json.dumps(stored),
            ],
        )
        row = cursor.fetchone()
    if row is not None:
        return IngestionEvent.objects.get(pk=row[0]), True
    return IngestionEvent.objects.get(dedup_key=key), False
