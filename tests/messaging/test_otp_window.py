"""The OTP window on real Redis: an OTP's accept and release open it, background work waits for it, boundedly."""

from __future__ import annotations

import threading
import time

import pytest
from django_redis import get_redis_connection

from messaging import dispatch, otp_window
from messaging.sending import worker
from pilot_status import metrics
from tests.messaging.sending_helpers import open_on_simulator, send

YIELDED = metrics.MESSAGES + "otp_window:yielded:"


def window_left_ms() -> int:
    return int(get_redis_connection("default").pttl(otp_window.KEY))


def yielded(kind: str) -> int:
    return int(get_redis_connection("default").get(YIELDED + kind) or 0)


def hold_the_window_open() -> None:
    """An open window that outlasts whatever the test does next however slow the machine (5 s), while
    a wait for it stays bounded by OTP_WINDOW_MS: what is tested is the look, not a race with the TTL."""
    get_redis_connection("default").set(otp_window.KEY, b"1", px=5000)


def test_only_the_other_lanes_wait():
    assert [otp_window.lane_waits(lane) for lane in ("otp", "utility", "marketing", "maintenance", "")] == [
        False, True, True, False, False]


def test_a_closed_window_costs_no_wait(db):
    assert otp_window.wait_for_window("webhook") == 0.0
    assert yielded("webhook") == 0


def test_an_open_window_is_waited_out_and_counted(db, settings):
    settings.OTP_WINDOW_MS = 200
    otp_window.open_window()
    assert 0 < window_left_ms() <= 200

    started = time.monotonic()
    waited = otp_window.wait_for_window("webhook")

    assert 0 < waited <= 0.2
    assert time.monotonic() - started >= waited
    assert yielded("webhook") == 1


def test_a_process_that_waited_goes_on_for_as_long_before_it_looks_again(db, settings):
    # Heavy OTP traffic keeps the window open: the background still gets half its time.
    settings.OTP_WINDOW_MS = 100
    otp_window.open_window()
    first = otp_window.wait_for_window("consumer")
    otp_window.open_window()
    assert otp_window.wait_for_window("consumer") == 0.0  # within the time it waited: not looked at
    time.sleep(first)
    otp_window.open_window()
    assert otp_window.wait_for_window("consumer") > 0  # it looks again, and waits for the window
    assert yielded("consumer") == 2


def test_a_thread_that_waited_does_not_let_the_other_threads_of_its_process_skip_the_window(db, settings):
    # Lane workers run their sends on a pool of threads (issue 26): "goes on without looking" is per
    # thread, as it was per prefork process, or one wait would let the other 31 threads skip theirs.
    settings.OTP_WINDOW_MS = 100
    otp_window.open_window()
    assert otp_window.wait_for_window("send:utility") > 0
    otp_window.open_window()
    assert otp_window.wait_for_window("send:utility") == 0.0  # this thread: within its time off

    waited: list[float] = []
    other = threading.Thread(target=lambda: waited.append(otp_window.wait_for_window("send:utility")))
    other.start()
    other.join()

    assert waited[0] > 0  # another thread still looks, and waits
    assert yielded("send:utility") == 2


def test_zero_turns_the_window_off(db, settings):
    settings.OTP_WINDOW_MS = 0
    otp_window.open_window()
    assert window_left_ms() == -2  # no key
    get_redis_connection("default").set(otp_window.KEY, b"1", px=500)
    assert otp_window.wait_for_window("webhook") == 0.0


def test_without_redis_nobody_waits_and_nothing_fails(db, settings, monkeypatch):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
        }
    }
    otp_window.open_window()
    assert otp_window.wait_for_window("webhook") == 0.0
    tried = []
    real_redis = metrics.redis
    monkeypatch.setattr(metrics, "redis", lambda: tried.append("redis") or real_redis())
    otp_window.open_window()  # within the backoff: not even tried
    assert otp_window.wait_for_window("webhook") == 0.0
    assert tried == []


@pytest.mark.parametrize("category, opens", [("OTP", True), ("UTILITY", False), ("MARKETING", False)])
def test_accepting_an_otp_opens_the_window(alice, alice_instance, category, opens):
    send(alice, category)
    assert (window_left_ms() > 0) is opens


def test_releasing_an_otp_opens_the_window_and_the_bulk_relay_waits_for_it(alice, alice_instance, settings):
    settings.OTP_WINDOW_MS = 200
    marketing = send(alice, "MARKETING")
    assert window_left_ms() == -2
    dispatch.release_due()
    assert window_left_ms() == -2  # a marketing release opens nothing
    assert yielded("relay:marketing") == 0

    send(alice, "OTP")
    get_redis_connection("default").delete(otp_window.KEY)  # the accept's window is gone; the release opens one
    dispatch.release_due(lanes=("otp",))
    assert window_left_ms() > 0

    dispatch.release_due(lanes=("marketing",))
    assert yielded("relay:marketing") == 1
    marketing.refresh_from_db()
    assert marketing.dispatched_at is not None


def test_a_send_of_another_lane_waits_before_its_call_and_an_otp_never_does(simulator, alice, alice_instance, settings):
    settings.OTP_WINDOW_MS = 200
    open_on_simulator(simulator, alice_instance)
    otp = send(alice, "OTP")  # opens the window
    hold_the_window_open()
    assert worker.send_one(str(otp.pk)) == "sent"
    assert yielded("send:otp") == 0

    utility = send(alice, "UTILITY")
    hold_the_window_open()
    assert worker.send_one(str(utility.pk)) == "sent"
    assert yielded("send:utility") == 1


def test_a_webhook_waits_for_the_window(alice, alice_instance, settings):
    from tests.ingestion.helpers import make_message, post, receipt, token_header

    settings.OTP_WINDOW_MS = 200
    make_message(alice.project, alice_instance)
    response = post(receipt("DELIVERY_ACK"), **token_header(alice_instance))
    assert response.status_code == 200 and yielded("webhook") == 0

    send(alice, "OTP")
    hold_the_window_open()
    started = time.monotonic()
    response = post(receipt("READ"), **token_header(alice_instance))
    assert time.monotonic() - started >= 0.19  # one whole window (OTP_WINDOW_MS, 200 ms), the most one wait lasts
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "processed", "reason": "applied"}
    assert yielded("webhook") == 1


def test_the_event_lock_looks_at_the_window_in_its_own_round_trip(db, settings):
    from ingestion.locks import event_lock
    from tests.ingestion.test_metrics import redis_round_trips

    settings.OTP_WINDOW_MS = 200
    with redis_round_trips() as calls, event_lock("probe-closed", "webhook:skipped", yields_as="webhook") as hold:
        assert hold
    assert calls == ["EVALSHA", "PIPELINE"] and yielded("webhook") == 0  # closed: the look cost nothing more

    hold_the_window_open()
    started = time.monotonic()
    with redis_round_trips() as calls, event_lock("probe-open", "webhook:skipped", yields_as="webhook") as hold:
        assert hold  # taken after one bounded wait
    assert time.monotonic() - started >= 0.19  # one whole window (OTP_WINDOW_MS, 200 ms), the most one wait lasts
    # a look, the take after the wait, the release (the suite sends its counts at once: INCRBY aside)
    assert [c for c in calls if c != "INCRBY"] == ["EVALSHA", "EVALSHA", "PIPELINE"] and yielded("webhook") == 1

    otp_window.open_window()  # it waited lately: it goes on without looking for as long
    with event_lock("probe-again", "webhook:skipped", yields_as="webhook") as hold:
        assert hold
    assert yielded("webhook") == 1

    otp_window.reset_local()
    with event_lock("probe-bare", "rabbitmq:skipped") as hold:  # no `yields_as`: never looks
        assert hold
    assert yielded("webhook") == 1
