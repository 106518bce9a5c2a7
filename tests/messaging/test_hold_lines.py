"""A held message writes one WAITING line per change of reason, not two lines per relay cycle
(issue 22: a MARKETING message held 4 hours by a disconnected instance wrote about 960 lines)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from messaging import dispatch
from messaging.models import Message, OutboxEntry
from messaging.sending import worker
from pilot_status.celery import app
from tests.messaging.sending_helpers import make_due, open_on_simulator, send


def cycle(message: Message, lane: str) -> str:
    """One relay cycle: the relay releases the due message, a lane worker runs its task."""
    make_due(message)
    OutboxEntry.objects.filter(message=message).update(available_at=timezone.now())
    try:
        assert dispatch.release_due(lanes=(lane,)).released == 1
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(lane)  # no worker here: the test runs the task itself
    return worker.send_one(str(message.pk))


def kinds(message: Message) -> list[str]:
    return list(message.events.order_by("created_at", "pk").values_list("kind", flat=True))


def test_a_held_message_writes_one_waiting_line_per_change_of_reason(simulator: Any, alice: Any, alice_instance: Any) -> None:
    open_on_simulator(simulator, alice_instance)
    simulator.instance(alice_instance.name, state="close")
    message = send(alice, category="MARKETING")
    for _ in range(6):
        assert cycle(message, "marketing") == "held"
    assert kinds(message) == ["ACCEPTED", "DISPATCHED", "WAITING"]

    # The reason changes (the instance's circuit opens instead): one new line.
    from messaging.sending import breaker, instance_state

    simulator.instance(alice_instance.name, state="open")
    instance_state.remember(alice_instance.name, "open")
    for _ in range(10):
        breaker.record(breaker.instance_scope(alice_instance.name), breaker.FAIL)
    for _ in range(3):
        assert cycle(message, "marketing") == "held"
    waiting = list(message.events.filter(kind="WAITING").order_by("created_at", "pk").values_list("detail", flat=True))
    assert [line["why"] for line in waiting] == ["instance not connected", "circuit open"]

    # Once it goes out, the timeline says so; a later hold starts a fresh line.
    from django_redis import get_redis_connection

    get_redis_connection("default").flushdb()
    assert cycle(message, "marketing") == "sent"
    assert kinds(message)[-2:] == ["ATTEMPT", "STATUS"]
    assert Message.objects.get(pk=message.pk).hold_reason is None
