"""Which numbers have exchanged messages with a recipient (`Contact`, either way): a recipient a number never
exchanged a message with is a cold contact for it (its daily quota), and the project's number that last exchanged
with a recipient sends to them first (the sticky sender; docs/sending-policy.md)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection

from .models import Contact
from .opt_outs import phone_variants

OUTBOUND, INBOUND = "outbound", "inbound"

_EXCHANGED = """
INSERT INTO messaging_contact (instance_id, phone, last_exchange_at, last_direction)
SELECT id, %(phone)s, %(at)s, %(direction)s FROM messaging_instance WHERE {match}
ON CONFLICT (instance_id, phone) DO UPDATE SET last_exchange_at = EXCLUDED.last_exchange_at,
    last_direction = EXCLUDED.last_direction
 WHERE messaging_contact.last_exchange_at <= EXCLUDED.last_exchange_at
"""


# A number sent to a recipient, as a CTE for the statement that ends the number's turn (slots.finish), its parameters
# `sent_params`'; an older exchange never overwrites a newer one.
SENT_CTE = "exchanged AS (" + _EXCHANGED.format(match="id = %(instance)s") + ")"


def sent_params(instance_id: int, phone: str, at: datetime) -> dict[str, Any]:
    return {"instance": instance_id, "phone": phone, "at": at, "direction": OUTBOUND}


def received(instance_name: str, phone: str, at: datetime) -> None:
    """A recipient wrote to a number (ingestion, `messages.upsert` from a contact)."""
    with connection.cursor() as cursor:
        cursor.execute(_EXCHANGED.format(match="name = %(name)s"),
                       {"name": instance_name, "phone": phone, "at": at, "direction": INBOUND})


# Whether the number `{instance}` (an SQL expression) never exchanged a message with the recipient: an expression for a
# statement that asks it along with more (slots.begin asks it with the number's turn), its parameters `cold_params`'.
COLD = """NOT EXISTS (SELECT 1 FROM messaging_contact c
                    WHERE c.instance_id = {instance} AND c.phone IN (%(cold_phone)s, %(cold_variant)s))"""


def cold_params(phone: str) -> dict[str, str]:
    """COLD's parameters for a recipient: the number as written and its other form (Brazil's ninth digit either way;
    the same number twice when it has none)."""
    variants = phone_variants(phone)
    return {"cold_phone": variants[0], "cold_variant": variants[-1]}


def known_pairs(pairs: Iterable[tuple[int, str]]) -> set[tuple[int, str]]:
    """Of these (number, recipient) pairs, the ones that exchanged a message (Brazil's ninth digit either way), in one
    query: the relay asks it for a whole pass's candidates."""
    pairs = set(pairs)
    variants = {pair: phone_variants(pair[1]) for pair in pairs}
    if not pairs:
        return set()
    rows = set(Contact.objects.filter(
        instance_id__in={number for number, _ in pairs},
        phone__in={phone for phones in variants.values() for phone in phones},
    ).values_list("instance_id", "phone"))
    return {pair for pair in pairs if any((pair[0], phone) in rows for phone in variants[pair])}


def known_by(instance_ids: list[int], phone: str) -> list[int]:
    """Of these numbers, the ones that exchanged with the recipient, the latest exchange first."""
    rows = Contact.objects.filter(instance_id__in=instance_ids, phone__in=phone_variants(phone))
    return list(dict.fromkeys(rows.order_by("-last_exchange_at").values_list("instance_id", flat=True)))
