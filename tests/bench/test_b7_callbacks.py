"""B7's pure parts: the delivery rates taken from the receiver's arrival times, and the callbacks worker's threads."""

from __future__ import annotations

import math

import pytest

from bench.scenarios.b7_callbacks import concurrency, rates


def test_the_steady_rate_leaves_out_the_ramp_and_the_tail() -> None:
    # given: 10 slow arrivals (ramp), 80 at 100/s, 10 slow ones (tail); the first tick one second before
    ramp = [100.0 + i for i in range(10)]
    steady = [110.0 + i / 100 for i in range(80)]
    tail = [111.0 + i for i in range(1, 11)]

    r = rates(tail + steady + ramp, started=99.0)  # in any order

    # then: ranks 10..89 are the steady ones: 79 intervals over 0.79 s
    assert r["steady"] == pytest.approx(100.0)
    assert r["steady_count"] == 80 and r["steady_s"] == pytest.approx(0.79)
    # first to last: 99 intervals over 21 s; from the first tick: 100 deliveries over 22 s
    assert r["first_to_last"] == pytest.approx(99 / 21)
    assert r["from_start"] == pytest.approx(100 / 22)


def test_without_trimming_the_steady_rate_is_first_to_last() -> None:
    arrivals = [0.0, 0.5, 1.0, 2.0]

    r = rates(arrivals, started=0.0, trim=0.0)

    assert r["steady"] == r["first_to_last"] == pytest.approx(1.5)


@pytest.mark.parametrize("arrivals", [[], [5.0], [5.0, 5.0]])
def test_a_rate_without_a_span_is_not_a_number(arrivals: list[float]) -> None:
    r = rates(arrivals, started=5.0)

    assert math.isnan(r["steady"]) and math.isnan(r["first_to_last"]) and math.isnan(r["from_start"])


def test_a_single_arrival_after_the_tick_has_a_rate_from_the_tick() -> None:
    r = rates([6.0], started=5.0)

    assert r["from_start"] == pytest.approx(1.0) and math.isnan(r["steady"])


def test_the_callbacks_workers_threads_are_read_from_its_command() -> None:
    assert concurrency(["celery", "worker", "-Q", "callbacks", "-P", "threads", "-c", "4", "-l", "info"]) == "4"
    assert concurrency(["celery", "worker", "-c"]) == "?"
    assert concurrency(["celery", "worker"]) == "?"
