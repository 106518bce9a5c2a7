"""Keyset cursors for the newest-first lists (messages, dead letters, a message's timeline).

A cursor is the (created_at, primary key) of the last row a page showed, base64url without padding;
the next page holds the rows before it. Clients treat it as opaque.
"""

from __future__ import annotations

import base64
from datetime import datetime

from django.utils.dateparse import parse_datetime


class BadCursor(ValueError):
    """Not a cursor we issued (or one tampered with)."""


def encode(created_at: datetime, pk: object) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{pk}".encode()).decode().rstrip("=")


def decode(cursor: str) -> tuple[datetime, str]:
    """The (created_at, primary key as text) a cursor names; BadCursor for anything else. The caller
    turns the key into its type (a tampered one is then a 400, not a database error later)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        at_text, _, pk = base64.urlsafe_b64decode(padded).decode().partition("|")
        at = parse_datetime(at_text)
        if at is None:
            raise ValueError
        return at, pk
    except ValueError as exc:  # binascii.Error and UnicodeDecodeError are ValueErrors too
        raise BadCursor("Invalid cursor.") from exc
