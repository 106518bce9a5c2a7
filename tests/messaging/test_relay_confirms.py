"""A release commits only once the broker has taken every task of it (messaging.lane_publisher).

Each failure is a real broker condition: a deleted lane queue, a full queue that refuses, a memory alarm
that blocks publishers. Each must fail the pass with nothing released, and the next pass must release.
"""

from __future__ import annotations

from urllib.parse import unquote, urlparse

import pytest
from django.conf import settings
from django.utils import timezone

from messaging import dispatch
from messaging.lane_publisher import LanePublisher, PublishNotConfirmed
from messaging.models import EventKind, MessageEvent, OutboxEntry
from pilot_status.celery import app
from tests.conftest import add_instance
from tests.messaging.sending_helpers import queue
from tests.support.services import close_broker_connection, memory_alarm, queue_policy


def released(ids: list[str]) -> int:
    return MessageEvent.objects.filter(message_id__in=ids, kind=EventKind.DISPATCHED).count()


def broker_vhost() -> str:
    return unquote(urlparse(settings.CELERY_BROKER_URL).path.lstrip("/")) or "/"


def test_a_release_is_in_its_queue_when_the_pass_returns(empty_lanes, fast_instances, alice):
    add_instance(alice.project, "alice-main")
    ids = queue(alice, "UTILITY", 7)

    assert dispatch.release_due(lanes=("utility",)).released == 7

    assert dispatch.lane_depths(("utility",))["utility"] == 7  # confirmed: no lag to wait out
    assert released(ids) == 7


def test_a_release_no_queue_takes_is_rolled_back_and_the_next_pass_declares_the_queue(
    empty_lanes, fast_instances, alice
):
    add_instance(alice.project, "alice-main")
    queue(alice, "UTILITY", 1)
    assert dispatch.release_due(lanes=("utility",)).released == 1  # the publisher has declared the queue
    ids = queue(alice, "UTILITY", 3)
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete("utility")

    # when: a pass publishes into the exchange with no queue bound (its depth look skipped)
    with pytest.raises(PublishNotConfirmed, match="no queue took 3"):
        dispatch.release_lane("utility", 10, timezone.now())

    # then: nothing was released, and the relay's next passes declare the queue again and release
    assert OutboxEntry.objects.filter(message_id__in=ids).count() == 3
    assert released(ids) == 0
    with pytest.raises(Exception):
        dispatch.lane_depths(("utility",))  # the first pass after the deletion fails, as before
    assert dispatch.release_due(lanes=("utility",)).released == 3
    assert dispatch.lane_depths(("utility",))["utility"] == 3


def test_a_queue_that_refuses_the_tasks_fails_the_pass(empty_lanes, fast_instances, alice):
    add_instance(alice.project, "alice-main")
    ids = queue(alice, "UTILITY", 4)
    dispatch.lane_depths(("utility",))

    # when: the lane's queue is full and refuses new tasks (basic.nack)
    with queue_policy(broker_vhost(), "^utility$", '{"max-length": 0, "overflow": "reject-publish"}'):
        with pytest.raises(PublishNotConfirmed, match="refused"):
            dispatch.release_lane("utility", 10, timezone.now())
        assert OutboxEntry.objects.filter(message_id__in=ids).count() == 4
        assert released(ids) == 0

    # then: once it takes tasks again, they are released
    assert dispatch.release_due(lanes=("utility",)).released == 4
    assert dispatch.lane_depths(("utility",))["utility"] == 4


@pytest.mark.serial
def test_a_broker_that_blocks_publishers_fails_the_pass_within_its_timeout(
    empty_lanes, fast_instances, alice, monkeypatch
):
    add_instance(alice.project, "alice-main")
    ids = queue(alice, "UTILITY", 3)
    dispatch.lane_depths(("utility",))  # declared before the alarm
    monkeypatch.setattr(dispatch, "_publisher", LanePublisher(confirm_timeout=1.0))

    # when: RabbitMQ's memory alarm blocks every publisher
    with memory_alarm():
        with pytest.raises(PublishNotConfirmed, match="not confirmed by the broker within 1 s"):
            dispatch.release_lane("utility", 10, timezone.now())
        assert OutboxEntry.objects.filter(message_id__in=ids).count() == 3
        assert released(ids) == 0

    # then: after the alarm the next pass releases them (a blocked publish the broker read before
    # blocking may land too: a duplicate the worker's lease claim ignores)
    assert dispatch.release_due(lanes=("utility",)).released == 3
    assert dispatch.lane_depths(("utility",))["utility"] >= 3
    assert released(ids) == 3


def test_a_kept_connection_the_broker_closed_is_replaced_within_the_pass(empty_lanes, fast_instances, alice):
    add_instance(alice.project, "alice-main")
    queue(alice, "UTILITY", 1)
    assert dispatch.release_due(lanes=("utility",)).released == 1
    ids = queue(alice, "UTILITY", 2)

    # when: the broker closes the relay's connection between two passes (an operator, a node going down)
    kept = dispatch.lane_publisher()._connection
    assert kept is not None
    close_broker_connection(kept.connection.sock.getsockname()[1])

    # then: the next pass publishes on a new connection instead of failing
    assert dispatch.release_lane("utility", 10, timezone.now()).released == 2
    assert released(ids) == 2
    assert dispatch.lane_depths(("utility",))["utility"] >= 3
