"""A message's timeline lists its status moves in the order they were applied (the row lock's
order), whatever the order in which their writers read the clock."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from messaging import lifecycle
from messaging.models import Status
from tests.ingestion.helpers import make_message


def test_a_move_that_read_its_clock_earlier_but_took_the_row_later_is_listed_after(alice, alice_instance):
    message = make_message(alice.project, alice_instance, status=Status.SENT)
    now = timezone.now()
    assert lifecycle.advance(message, Status.DELIVERED, at=now)

    # A concurrent receipt stamped its line a moment earlier, then waited for the row.
    assert lifecycle.advance(message, Status.READ, at=now - timedelta(seconds=1))

    lines = list(message.events.filter(kind="STATUS").order_by("created_at", "pk"))
    assert [line.detail["status"] for line in lines] == ["DELIVERED", "READ"]
    assert lines[0].created_at >= now  # never earlier than the writer's own clock


def test_a_relay_pass_whose_clock_reads_the_accept_time_lists_dispatched_after_accepted(
    alice, alice_instance, monkeypatch
):
    from messaging import dispatch, opt_ins
    from messaging.accept import SendRequest, accept_message
    from messaging.models import Message
    from pilot_status.celery import app

    opt_ins.record(alice.project, "+5511988887777", "form")
    body = accept_message(alice.project, None, "LIVE", SendRequest("+5511988887777", "UTILITY", "hi"))
    message = Message.objects.get(pk=body["id"])
    # The pass read its clock at the very moment of the accept (the earliest it can release it).
    monkeypatch.setattr(dispatch.timezone, "now", lambda: message.created_at)
    try:
        assert dispatch.release_due(lanes=("utility",)).released == 1
        assert dispatch.lane_depths(("utility",))["utility"] == 1  # confirmed before the pass returned
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge("utility")  # no worker here: drop the published task
    kinds = list(message.events.order_by("created_at", "pk").values_list("kind", flat=True))
    assert kinds[:2] == ["ACCEPTED", "DISPATCHED"]
