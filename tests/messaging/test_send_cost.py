"""What one successful send costs the database: the lane worker's hot path (bench B2).

Counted, not timed: every statement is a round trip and every commit an fsync on Postgres, and on
a loaded machine each one is a scheduler wake-up of two processes. The numbers are a ceiling a
change must not raise by accident; lower them freely.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from messaging import opt_ins
from messaging.models import Message
from messaging.sending import worker
from pilot_status import metrics
from tests.messaging.sending_helpers import open_on_simulator, send


@contextmanager
def counted() -> Iterator[list[str]]:
    statements: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql.split(None, 1)[0].upper())
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield statements


def test_a_send_costs_three_statements(simulator, alice, alice_instance, django_capture_on_commit_callbacks):
    open_on_simulator(simulator, alice_instance)
    assert worker.send_one(str(send(alice).pk)) == "sent"  # learns the instance's state (cached)
    message = send(alice)

    sent_counter = "ps:metrics:messages:status:SENT:utility"
    before = int(metrics.redis().get(sent_counter) or 0)

    with django_capture_on_commit_callbacks(execute=True), counted() as statements:
        assert worker.send_one(str(message.pk)) == "sent"

    # the claim, the result with its timeline lines (each one statement), and the look for
    # receipts that raced ahead of the send
    assert statements == ["WITH", "WITH", "SELECT"], statements
    message.refresh_from_db()
    assert message.status == "SENT" and message.attempts == 1 and message.evolution_message_id
    assert int(metrics.redis().get(sent_counter) or 0) == before + 1  # counted as a saved event would be
    assert list(message.events.order_by("created_at", "pk").values_list("kind", flat=True))[-2:] == ["ATTEMPT", "STATUS"]


@pytest.mark.usefixtures("empty_lanes")  # the relay publishes its tasks: none is left for the tests after this one
def test_an_unofficial_numbers_send_costs_five_statements(simulator, alice, django_capture_on_commit_callbacks):
    # given: an unofficial number that knows the recipient, a message asked on it (as bench B9's), the relay's
    # reservation of the number for it, and the number's state learnt by an earlier send
    from datetime import timedelta

    from django.utils import timezone

    from messaging import dispatch, exchanges
    from messaging.accept import SendRequest, accept_message
    from messaging.models import Contact, Environment, SendSchedule
    from tests.conftest import add_instance

    number = add_instance(alice.project, "alice-phone", priority=10, profile="unofficial")
    open_on_simulator(simulator, number)
    recipient = alice.project.test_number
    exchanges.received(number.name, recipient, timezone.now())
    opt_ins.record(alice.project, recipient, "form")

    def reserved() -> str:
        SendSchedule.objects.filter(instance=number).update(next_send_at=timezone.now() - timedelta(seconds=1))
        accepted = accept_message(alice.project, None, Environment.LIVE,
                                  SendRequest(recipient, "UTILITY", "hi", instance=number.name))
        assert dispatch.release_due(lanes=("utility",)).released == 1
        return str(accepted["id"])

    assert worker.send_one(reserved()) == "sent"
    message_id = reserved()

    # when: the lane worker sends it
    with django_capture_on_commit_callbacks(execute=True), counted() as statements:
        assert worker.send_one(message_id) == "sent"

    # then: the claim, the number's turn (with its health and whether the recipient is a cold contact), the turn's
    # end with the number's exchange with the recipient, the result with its timeline lines, and the look for receipts
    # that raced ahead of the send (no release after the turn's end: it freed the number)
    assert statements == ["WITH", "UPDATE", "WITH", "WITH", "SELECT"], statements
    schedule = SendSchedule.objects.get(instance=number)
    assert schedule.reserved_by is None and schedule.day_sent == 2 and schedule.day_cold == 0
    contact = Contact.objects.get(instance=number, phone=recipient)
    assert contact.last_direction == "outbound" and contact.last_exchange_at >= schedule.hour_started_at
    message = Message.objects.get(pk=message_id)
    assert message.status == "SENT" and message.attempts == 1
