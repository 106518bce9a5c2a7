"""B8's OTP target is judged on each OTP's time less the simulator's own lateness on its call
(bench/scenarios/b8_slow_gateway.punctual_ms); the report shows that figure beside the measured one. Its
throughput is judged against the caps or the mean of the CPU ceilings measured around each run (first and last in
older recordings)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from bench.report_gateway import _b8_bar, _b8_otp
from bench.scenarios.b8_slow_gateway import punctual_ms, throughput_bar

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=timezone.utc)


def _row(total_ms: float, gateway_id: str) -> tuple[datetime, datetime, str]:
    return T0, T0 + timedelta(milliseconds=total_ms), gateway_id


def test_only_the_simulators_overrun_on_the_otps_own_call_comes_off() -> None:
    # given: three OTPs; the first's call ran 200 ms late at the simulator, the second's 15 ms early (its
    # timer fired a little before the latency), the third's call is not in the simulator's log
    rows = [_row(3600, "A"), _row(3400, "B"), _row(3500, "C")]
    late = {"A": 200.0, "B": -15.0, "X": 900.0}

    # when
    judged = punctual_ms(rows, late)

    # then: A loses its 200 ms, B keeps everything (an early answer is not credited), C keeps everything
    assert judged == [3400.0, 3400.0, 3500.0]


def test_an_unsent_otp_stays_infinite() -> None:
    assert punctual_ms([(T0, None, "")], {"": 500.0}) == [math.inf]


def test_the_report_shows_the_judged_p99_and_the_measured_one() -> None:
    run = {"otp_p99_ms": 3639.1, "otp_p99_punctual_ms": 3481.7}
    assert _b8_otp(run) == "3,482 ms with the simulator's lateness taken off (measured 3,639 ms)"
    assert _b8_otp({"otp_p99_ms": 3639.1}) == "3,639 ms"  # a recording from before the judged figure


def test_the_throughput_bar_is_the_caps_or_the_mean_of_the_ceilings_before_and_after() -> None:
    assert throughput_bar(100.0, 72.0, 86.0) == 79.0  # the host's phase moved between the two ceilings
    assert throughput_bar(60.0, 72.0, 86.0) == 60.0  # the caps, where lower
    assert throughput_bar(100.0, 73.7) == 73.7  # one ceiling alone


def test_the_report_names_both_ceilings_and_reads_a_recording_with_one() -> None:
    run = {"pacing_caps_per_s": 100.0}
    both = {"runs": [run], "bar_per_s": 79.0, "ceiling": {"throughput_per_s": 72.0},
            "ceiling_after": {"throughput_per_s": 86.0}}
    assert _b8_bar(both) == (79.0, "lower of the caps (100/s) and the CPU ceiling (the mean of 72.0/s first and "
                                   "86.0/s last)")
    first_only = {"runs": [run], "bar_per_s": 73.7, "ceiling": {"throughput_per_s": 73.7}}
    assert _b8_bar(first_only) == (73.7, "lower of the caps (100/s) and the CPU ceiling (73.7/s)")


def test_each_threads_run_is_judged_against_the_ceilings_around_it() -> None:
    run = {"pacing_caps_per_s": 100.0, "ceilings_around": [1, 2], "bar_per_s": 55.0}
    b8 = {"runs": [run], "bar_per_s": 60.0, "ceilings": [{"throughput_per_s": 70.0}, {"throughput_per_s": 50.0},
                                                          {"throughput_per_s": 60.0}]}
    assert _b8_bar(b8, run) == (55.0, "lower of the caps (100/s) and the CPU ceiling (the mean of 50.0/s just before "
                                      "and 60.0/s just after)")
    assert _b8_bar(b8) == (60.0, "lower of the caps (100/s) and the CPU ceiling (the mean of 70.0/s, 50.0/s, 60.0/s)")
