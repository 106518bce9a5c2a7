"""Helpers for the sending tests: accept a message through the real API, let time pass on a row."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from messaging import opt_ins
from messaging.accept import SendRequest, accept_message
from messaging.models import DeadLetter, Environment, Message

RECIPIENT = "+5511988887777"


def send(actor: Any, category: str = "UTILITY", to: str = RECIPIENT, opt_in: bool = True, **extra: Any) -> Message:
    """Accept a message through the client API (in-process DRF) and return its row."""
    if opt_in:
        opt_ins.record(actor.project, to, "signup form")
    body = {"to": to, "category": category, "text": "Order {{n}} shipped", "variables": {"n": "42"}, **extra}
    response = actor.client().post("/v1/messages/send", body, format="json")
    assert response.status_code == 202, response.content
    return Message.objects.get(pk=response.json()["id"])


def make_due(message: Message) -> None:
    """Time passes until the message's next attempt is due (deliverUntil moves closer by as much)."""
    message.refresh_from_db()
    now = timezone.now()
    ahead = max(message.next_attempt_at - now, timedelta(0))
    Message.objects.filter(pk=message.pk).update(next_attempt_at=now, deliver_until=message.deliver_until - ahead)


def events(message: Message, kind: str) -> list[dict[str, Any]]:
    return [e.detail for e in message.events.filter(kind=kind).order_by("created_at", "pk")]


def assert_dead_lettered(message: Message, reason: str) -> DeadLetter:
    message.refresh_from_db()
    assert message.status == "FAILED" and message.failure_reason == reason
    letter = DeadLetter.objects.get(message=message)
    assert letter.reason == reason and letter.detail
    assert events(message, "DEAD_LETTERED")
    return letter


def open_on_simulator(simulator: Any, *instances: Any, **faults: Any) -> None:
    for instance in instances:
        simulator.instance(instance.name, state="open", token=f"TOKEN-{instance.name}".upper())
        if faults:
            simulator.faults(instance.name, **faults)


def sends_ok(simulator: Any, instance: str) -> list[dict[str, Any]]:
    return [s for s in simulator.sends(instance=instance) if s.get("id")]


def queue(actor: Any, category: str, count: int, to: str | None = None) -> list[str]:
    """Accept `count` messages through the accept funnel (no HTTP: the rate limit is not under test)."""
    phone = to or actor.project.test_number
    opt_ins.record(actor.project, phone, "form")
    return [
        accept_message(actor.project, None, Environment.LIVE, SendRequest(phone, category, f"hi {i}"))["id"]
        for i in range(count)
    ]


def exchanged(instance_id: int, phone: str, at: Any) -> None:
    """A number sent to a recipient, written as the end of a send's turn writes it (exchanges.SENT_CTE)."""
    from django.db import connection

    from messaging import exchanges

    with connection.cursor() as cursor:
        cursor.execute(f"WITH {exchanges.SENT_CTE} SELECT 1", exchanges.sent_params(instance_id, phone, at))


def is_cold(instance_id: int, phone: str) -> bool:
    """Whether the number never exchanged a message with the recipient, as a send's turn asks it (exchanges.COLD)."""
    from django.db import connection

    from messaging import exchanges

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {exchanges.COLD.format(instance='%(instance)s')}",
                       {"instance": instance_id, **exchanges.cold_params(phone)})
        return bool(cursor.fetchone()[0])
