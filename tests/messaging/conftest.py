"""Fixtures of the relay tests (test_relay_fairness, test_relay_confirms): empty lane queues, unpaced
instances; and the accept path's modes (issue 25's switches), for the accept tests to run in each."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.test import override_settings

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


# The accept path's devices, each switched off alone, then all of them (the plain Django way): every
# accept test that asks for accept_mode runs in each, and must give the same answers and rows.
ACCEPT_MODES: dict[str, dict[str, bool]] = {
    "one-statement": {},  # the defaults
    "no-memory": {"ACCEPT_REMEMBER_ROUTING": False},
}
# The modes in which a process judges on remembered candidates: a usual accept is one statement.
REMEMBERING = ["one-statement"]


@pytest.fixture(params=list(ACCEPT_MODES))
def accept_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The mode's settings for the whole test (narrow it with parametrize(..., indirect=True))."""
    with override_settings(**ACCEPT_MODES[request.param]):
        yield request.param
