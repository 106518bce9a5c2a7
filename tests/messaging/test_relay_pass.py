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


def test_a_bulk_relay_gathers_rows_that_come_due_at_moments_of_their_own():
    from messaging.management.commands.run_relay import timed_wait

    # nothing waits: the poll; a row due in 0.5 s: then
    assert timed_wait(None, 0.0, 1.0, 0.2) == 1.0
    assert timed_wait(0.5, 0.01, 1.0, 0.2) == 0.5
    # a row due in 10 ms, 30 ms after the last pass began: taken with those due in the next 170 ms, in one pass
    assert timed_wait(0.01, 0.03, 1.0, 0.2) == pytest.approx(0.17)
    # a row already due, the last pass long ago: at once; the OTP lane's relay (no gathering) at once too
    assert timed_wait(-1.0, 0.5, 1.0, 0.2) == 0.0
    assert timed_wait(0.01, 0.0, 1.0, 0.0) == 0.01
    # never past the poll
    assert timed_wait(5.0, 0.0, 1.0, 0.2) == 1.0


@pytest.mark.django_db(transaction=True)
def test_a_relay_wakes_for_new_work_of_its_own_lanes_only(settings):
    # given: a bulk relay waiting on the outbox channel, and an OTP relay; nothing due
    import time

    from django.db import connection

    from messaging.inserts import notify_relay

    settings.RELAY_POLL_SECONDS = 0.5
    db = connection.settings_dict  # the test database: a NOTIFY reaches the listeners of its own database only
    settings.DATABASE_URL = f"postgresql://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    bulk, otp = Command(), Command()
    bulk.lanes, bulk.gather = ("utility", "marketing"), 0.2
    otp.lanes, otp.gather = ("otp",), 0.0
    bulk_listener, otp_listener = bulk._listen(), otp._listen()
    try:
        # when: an OTP is accepted (its NOTIFY names its lane)
        notify_relay("otp")
        time.sleep(0.1)  # delivered to both listeners
        started = time.monotonic()
        bulk._wait(bulk_listener)
        bulk_waited = time.monotonic() - started
        started = time.monotonic()
        otp._wait(otp_listener)
        otp_waited = time.monotonic() - started

        # then: the bulk relay slept its poll out (no pass over the marketing lane for an OTP), the OTP relay woke
        assert bulk_waited >= 0.45
        assert otp_waited < 0.45

        # and a NOTIFY for a lane no relay knows (an older or newer writer) still wakes every relay
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify('outbox', 'some-new-lane')")
        time.sleep(0.1)
        started = time.monotonic()
        bulk._wait(bulk_listener)
        assert time.monotonic() - started < 0.45
    finally:
        bulk_listener.close()
        otp_listener.close()
