"""A message's timeline, a page at a time (issue 22): `GET /v1/messages/{id}` carries the latest
INLINE lines, `GET /v1/messages/{id}/events` and the dashboard page through the rest, newest first.

A cursor is the (time, id) of the last line a page showed, base64url; the next page has the lines
before it (index event_timeline: message, created_at).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from . import cursors
from .cursors import BadCursor as BadCursor  # re-exported: callers of page() catch it
from .models import Message, MessageEvent

# How many of the latest lines GET /v1/messages/{id} and the dashboard show at once: every timeline
# of an ordinary message fits (six to ten lines); a long one says where the rest is.
INLINE = 50
MAX_PAGE = 200


@dataclass(frozen=True)
class Page:
    lines: list[MessageEvent]  # newest first
    next_cursor: str | None  # the lines before the last one here, or None: there are none


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    at, pk = cursors.decode(cursor)
    try:
        return at, int(pk)
    except ValueError as exc:
        raise BadCursor("Invalid cursor.") from exc


def page(message: Message, cursor: str | None = None, limit: int = INLINE) -> Page:
    """Up to `limit` lines, newest first, before the cursor's line (from the latest without one)."""
    rows = MessageEvent.objects.filter(message=message)
    if cursor:
        at, pk = decode_cursor(cursor)
        rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk))
    lines = list(rows.order_by("-created_at", "-pk")[: limit + 1])
    more = len(lines) > limit
    lines = lines[:limit]
    return Page(lines, cursors.encode(lines[-1].created_at, lines[-1].pk) if more else None)


def latest(message: Message, limit: int = INLINE) -> Page:
    """The latest lines in timeline order (oldest first), and the cursor of the ones before them."""
    newest_first = page(message, None, limit)
    return Page(list(reversed(newest_first.lines)), newest_first.next_cursor)
