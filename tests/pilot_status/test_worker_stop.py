"""A Celery worker sees a stop (SIGTERM) within a second, idle or not (pilot_status/celery.py).

The SIGTERM handler only sets a flag that the worker's event loop reads once its poll returns; the poll waits
for the next timer, up to kombu's 10 s. Idle lane workers took ~10 s to stop (compose, honcho, a deploy, every
test that restarts one). Their event loop now has a timer every STOP_CHECK_SECONDS.
"""

from __future__ import annotations

from types import SimpleNamespace

from kombu.asynchronous import Hub
from kombu.asynchronous.timer import Timer

from pilot_status import celery


def test_an_idle_workers_event_loop_waits_at_most_a_second_before_it_reads_the_stop_flag() -> None:
    # given: a worker's event loop (celery.worker.components: its timer's max_interval is 10 s) whose only
    # timer is far off (as the broker connection's heartbeat check)
    hub = Hub(Timer(max_interval=10.0))
    try:
        hub.call_repeatedly(60, lambda: None)
        assert hub.fire_timers() == 10  # the poll's timeout: what a stop waited for

        # when: the worker is ready
        celery._notice_a_stop_within_a_second(sender=SimpleNamespace(hub=hub))

        # then
        assert hub.fire_timers() <= celery.STOP_CHECK_SECONDS
    finally:
        hub.close()


def test_a_worker_without_an_event_loop_is_left_as_it_is() -> None:
    celery._notice_a_stop_within_a_second(sender=SimpleNamespace(hub=None))
