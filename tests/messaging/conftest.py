"""Fixtures of the relay tests (test_relay_fairness, test_relay_confirms): empty lane queues, unpaced
instances; and the accept path's modes (issue 25's switches), for the accept tests to run in each."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from messaging import dispatch
from pilot_status.celery import LANES, app


@pytest.fixture
def empty_lanes(db) -> Iterator[None]:
    def purge() -> None:
        # Purge until the lanes stay empty: a task an earlier test's worker held unacked goes back
        # to its queue when that worker's connection closes, which can be just after a purge.
        dispatch.lane_depths(LANES)  # declares the queues
        for _ in range(20):
            with app.connection_for_write() as conn:
                for lane in LANES:
                    conn.default_channel.queue_purge(lane)
            time.sleep(0.05)
            if not any(dispatch.lane_depths(LANES).values()):
                return
        raise AssertionError("the lane queues never stayed empty")

    purge()
    dispatch.turn_order = dispatch.TurnOrder()  # what earlier passes released says nothing here
    yield
    purge()


@pytest.fixture
def fast_instances(settings):
    settings.SEND_RATE_PER_INSTANCE = 10_000
    settings.SEND_RATE_BURST = 10_000

