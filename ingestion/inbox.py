"""The inbox: a stable dedup key per Evolution event, and an insert that is safe from both channels."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.utils.dateparse import parse_datetime

from messaging.models import Instance

from .models import IngestionEvent

# Events whose `data` is a state snapshot rather than a unique occurrence: the same data comes
# back every time the state returns (open → connecting → open), so the occurrence time is part
# of their identity. Evolution reuses one body for all retries of a webhook, so retries still
# collapse; with the real Evolution the two channels stamp `date_time` separately, giving at
# most one row per channel for one transition, both applying the same state (harmless).
SNAPSHOT_EVENTS = frozenset({"connection.update", "qrcode.updated", "presence.update"})

# Evolution's event names are dotted lower case (`messages.update`, `group-participants.update`).
EVENT_NAME_MAX_CHARS = 64  # the inbox's `event` column
_EVENT_NAME = re.compile(rf"[a-z][a-z0-9_.-]{{0,{EVENT_NAME_MAX_CHARS - 1}}}")
# An instance is named by its row: nothing longer than the column can name one (Evolution's own
# names are short; the simulator's and the samples' are a dozen characters).
INSTANCE_NAME_MAX_CHARS: int = Instance._meta.get_field("name").max_length or 100
# Not a name anyone can give an instance: C0 controls and DEL (NUL among them, which Postgres'
# text refuses), and lone surrogates (which UTF-8 cannot carry).
_NOT_IN_A_NAME = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")

# Credentials travel in the envelope; they are never kept at rest (issue 21). Evolution puts the
# instance token in `apikey` (docs/evolution-setup.md, "The envelope"); the others are the token-like names its
# instance objects carry (fetchInstances: `token`, `wavoipToken`; create: `hash`,
# `accessTokenWaBusiness`) and the `jwt_key` of its webhook headers, in case a version or a proxy
# copies them into the envelope. Only the envelope's own fields: `data` is the event's content and
# part of its identity (dedup_key), which must stay the same on both channels and after storage.
CREDENTIAL_FIELDS = frozenset({"apikey", "token", "hash", "jwt_key", "wavoipToken", "accessTokenWaBusiness"})
# What the envelope carries about its own transport, never stored either.
_NOT_STORED = CREDENTIAL_FIELDS | {"already_saved"}

# `date_time` outside these years is junk (Evolution stamps its own clock); such an event has no
# occurrence time rather than one Postgres or Python cannot carry back (year 0, year 10000).
_OCCURRED_YEARS = range(2000, 2200)


def dedup_key(payload: dict[str, Any]) -> str:
    """SHA-256 of what identifies the event, not of how it travelled.

    `date_time`, `destination`, `server_url`, `sender` and `apikey` differ between the webhook
    and the RabbitMQ copy of one event (or are channel plumbing), so they are left out; two
    statuses of one message differ in `data.status` and are two events.
    """
    identity: dict[str, Any] = {
        "event": payload.get("event"),
        "instance": payload.get("instance"),
        "data": payload.get("data"),
    }
    if payload.get("event") in SNAPSHOT_EVENTS:
        identity["date_time"] = payload.get("date_time")
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: a lone surrogate (legal in JSON, not in UTF-8) must hash, not crash.
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def storable(value: Any) -> Any:
    """A copy Postgres' jsonb accepts: NUL and lone surrogates replaced by U+FFFD.

    Evolution relays user content (names, texts) that may hold either; refusing the event would
    make Evolution retry it for ever and lose its effect. The dedup key is computed on the
    original, so both channels still meet on the same key.
    """
    if isinstance(value, str):
        cleaned = value.replace("\x00", "\ufffd")
        try:
            cleaned.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate
            cleaned = cleaned.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return cleaned
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(item) for item in value]
    return value


def at_rest(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as the inbox keeps it: without credentials or our own transport flag.

    Never changes the dedup key: none of these fields is part of an event's identity.
    """
    if _NOT_STORED.isdisjoint(payload):
        return payload
    return {k: v for k, v in payload.items() if k not in _NOT_STORED}


def _as_jsonb(payload: dict[str, Any]) -> str:
    dumped = json.dumps(payload)
    # Fast path: ASCII-escaped JSON shows NUL as \u0000 and any surrogate as \udXXX.
    if "\\u0000" in dumped or "\\ud" in dumped:
        dumped = json.dumps(storable(payload))
    return dumped


def key_id_of(payload: dict[str, Any]) -> str:
    """The WhatsApp message id an event is about (receipts carry it as keyId, sends as key.id)."""
    data = payload.get("data")
    if not isinstance(data, dict):
        return ""
    if isinstance(data.get("keyId"), str):
        return str(data["keyId"])
    key = data.get("key")
    if isinstance(key, dict) and isinstance(key.get("id"), str):
        return str(key["id"])
    if payload.get("event") == "messages.delete" and isinstance(data.get("id"), str):
        return str(data["id"])
    return ""


def occurred_at_of(payload: dict[str, Any]) -> datetime | None:
    value = payload.get("date_time")
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = parse_datetime(value)
    except ValueError:
        return None
    if parsed is None:
        return None
    if parsed.tzinfo is None:  # Evolution always writes a zone (Z); without one, take UTC
        parsed = parsed.replace(tzinfo=UTC)
    try:
        in_utc = parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        return None
    return in_utc if in_utc.year in _OCCURRED_YEARS else None


def instance_name_ok(name: Any) -> bool:
    """Whether `name` can be an instance's: a non-empty string within INSTANCE_NAME_MAX_CHARS,
    no control character, no lone surrogate. Checked before any lookup, cache or storage."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= INSTANCE_NAME_MAX_CHARS
        and _NOT_IN_A_NAME.search(name) is None
    )


def envelope_problem(payload: Any) -> str | None:
    """The first field that keeps `payload` from being Evolution's envelope {event, instance, data,
    ...} (the same on both channels); None when it is one."""
    if not isinstance(payload, dict):
        return "body"
    event = payload.get("event")
    if not isinstance(event, str) or _EVENT_NAME.fullmatch(event) is None:
        return "event"
    if not instance_name_ok(payload.get("instance")):
        return "instance"
    if not isinstance(payload.get("data"), (dict, list)):
        return "data"
    return None


def is_evolution_event(payload: Any) -> bool:
    """The envelope Evolution sends on both channels: {event, instance, data, ...}."""
    return envelope_problem(payload) is None


# One round trip for both outcomes: the new row, or (ON CONFLICT) the row already there. The
# second SELECT sees only what was committed when the statement began, so a row committed by a
# concurrent insert we waited on is not in it: `record` then reads it in a second statement.
_INSERT_OR_EXISTING = """
    WITH new AS (
        INSERT INTO evolution_ingestion_events
            (dedup_key, channel, event, instance_name, key_id, payload, received_at, occurred_at,
             outcome, forward_attempts, last_error)
        VALUES (%(key)s, %(channel)s, %(event)s, %(instance)s, %(key_id)s, %(payload)s::jsonb, now(),
                %(occurred_at)s, '', 0, '')
        ON CONFLICT (dedup_key) DO NOTHING
        RETURNING id, channel, received_at, processed_at, outcome, forward_attempts
    )
    SELECT true, id, channel, received_at, processed_at, outcome, forward_attempts FROM new
    UNION ALL
    SELECT false, id, channel, received_at, processed_at, outcome, forward_attempts
      FROM evolution_ingestion_events
     WHERE dedup_key = %(key)s AND NOT EXISTS (SELECT 1 FROM new)
"""
_EXISTING = """
    SELECT false, id, channel, received_at, processed_at, outcome, forward_attempts
      FROM evolution_ingestion_events WHERE dedup_key = %s
"""


def row_values(channel: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The inbox row's columns for this copy of an event (the raw payload as JSON text)."""
    return {
        "key": dedup_key(payload),
        "channel": channel,
        "event": storable(str(payload.get("event"))[:64]),
        "instance": storable(str(payload.get("instance"))[:100]),
        "key_id": storable(key_id_of(payload)[:64]),
        "payload": _as_jsonb(at_rest(payload)),
        "occurred_at": occurred_at_of(payload),
    }


def record(channel: str, payload: dict[str, Any]) -> tuple[IngestionEvent, bool]:
    """Store the raw event once; returns (row, created). Concurrent channels meet at the unique key.

    In autocommit (the consumer) the row is committed when this returns, so the consumer may
    ack; inside a transaction (handlers.ingest) a new row stays ours until that commits. One
    round trip in the usual cases (new event, or a copy of one already stored). The row
    returned carries the identity fields and processing state; `payload` is this copy's.
    """
    params = row_values(channel, payload)
    key = params["key"]
    stored = at_rest(payload)
    with connection.cursor() as cursor:
        row = None
        # A row deleted between our conflict and the read (pruning) means: insert again.
        for _ in range(3):
            cursor.execute(_INSERT_OR_EXISTING, params)
            row = cursor.fetchone()
            if row is None:  # the conflicting row was committed after this statement began
                cursor.execute(_EXISTING, [key])
                row = cursor.fetchone()
            if row is not None:
                break
    if row is None:
        raise IngestionEvent.DoesNotExist(f"inbox row {key} vanished while it was being stored")
    created, pk, row_channel, received_at, processed_at, outcome, forward_attempts = row
    event = IngestionEvent(
        pk=pk, dedup_key=key, channel=row_channel, event=params["event"], instance_name=params["instance"],
        key_id=params["key_id"], payload=stored, received_at=received_at, occurred_at=params["occurred_at"],
        processed_at=processed_at, outcome=outcome, forward_attempts=forward_attempts,
    )
    event._state.adding = False  # a row of the table, not a new object (save() updates it)
    event._state.db = connection.alias
    return event, bool(created)
