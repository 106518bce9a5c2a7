"""A message's timeline lists its status moves in the order they were applied (the row lock's
order), whatever the order in which their writers read the clock."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from messaging.models import Status
from tests.ingestion.helpers import make_message


def test_a_move_that_read_its_clock_earlier_but_took_the_row_later_is_listed_after(alice, alice_instance):
    message = make_message(alice.project, alice_instance, status=Status.SENT)
    now = timezone.now()
    assert message.advance(Status.DELIVERED, at=now)

    # A concurrent receipt stamped its line a moment earlier, then waited for the row.
    assert message.advance(Status.READ, at=now - timedelta(seconds=1))

    lines = list(message.events.filter(kind="STATUS").order_by("created_at", "pk"))
    assert [line.detail["status"] for line in lines] == ["DELIVERED", "READ"]
    assert lines[0].created_at >= now  # never earlier than the writer's own clock
