"""The size bound of an Evolution event, the same on both channels (issue 45 §7; docs/security.md).

Evolution's real events outgrow the client API's body bound (DATA_UPLOAD_MAX_MEMORY_SIZE, 64 KiB): an
inbound image carries its caption (up to 1,024 characters) and the base64 jpegThumbnail WhatsApp attaches,
and a `messages.set` history batch carries hundreds of messages. So the webhook reads up to
EVOLUTION_EVENT_MAX_BYTES instead, the RabbitMQ consumer refuses a body over the same bound before storing
it, and both count the refusal (`webhook:too_large`, `rabbitmq:too_large`): an event either channel refuses
is never stored, so nothing forwards it again.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


class EventTooLarge(Exception):
    pass


def too_large(size: int) -> bool:
    return size > settings.EVOLUTION_EVENT_MAX_BYTES


def read_body(request: HttpRequest) -> bytes:
    """The request's body within the event bound (not the API's), or EventTooLarge. A declared length over
    the bound is refused before anything is read; the read itself stops one byte past it."""
    limit = settings.EVOLUTION_EVENT_MAX_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise EventTooLarge
    body = request.read(limit + 1)
    if len(body) > limit:
        raise EventTooLarge
    request._body = body  # request.body answers from here now (Django's own cache of it)
    return body
