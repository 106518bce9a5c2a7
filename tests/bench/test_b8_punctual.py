"""B8's OTP target is judged on each OTP's time less the simulator's own lateness on its call
(bench/scenarios/b8_slow_gateway.punctual_ms); the report shows that figure beside the measured one."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from bench.report_gateway import _b8_otp
from bench.scenarios.b8_slow_gateway import punctual_ms

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
