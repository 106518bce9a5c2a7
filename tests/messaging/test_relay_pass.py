"""The relay loop's own chores: it declares a lane queue once, and says when a pass was slow."""

from __future__ import annotations

import logging

import pytest

from messaging import dispatch
from messaging.management.commands.run_relay import SLOW_PASS_SECONDS, Command
from pilot_status.celery import app


def test_a_lane_queue_deleted_under_the_relay_is_declared_again_on_the_next_pass():
    dispatch.lane_depths(("utility",))
    assert "utility" in dispatch._declared
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete("utility")

    with pytest.raises(Exception):
        dispatch.lane_depths(("utility",))  # a pass fails, the relay logs it and tries again
    assert dispatch.lane_depths(("utility",)) == {"utility": 0}


def test_a_slow_pass_is_logged_with_what_it_did(caplog):
    command = Command()
    command.lanes = ("utility", "marketing")
    with caplog.at_level(logging.WARNING, logger="messaging.relay"):
        command._report_slow_pass(SLOW_PASS_SECONDS / 10, dispatch.Release(5, 0))
        assert caplog.records == []
        command._report_slow_pass(SLOW_PASS_SECONDS + 0.3, dispatch.Release(200, 1, {"publish": 0.7, "depths": 0.05}))
    assert "slow pass over utility,marketing" in caplog.text
    assert "released 200, held 1; seconds in publish 0.70, depths 0.05" in caplog.text


def test_a_pass_says_where_its_time_went(db):
    result = dispatch.release_due(lanes=("utility",))
    assert result.released == 0
    assert set(result.phases) == {"depths", "candidates"}  # nothing due: no lock, pace or publish
    assert all(seconds >= 0 for seconds in result.phases.values())
