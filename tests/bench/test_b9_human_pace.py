"""B9 judges each number's pace against what its policy allowed (bench/scenarios/b9_human_pace.py): the slots the
product wrote to the number's schedule, and the sends' receipts at the gateway."""

from __future__ import annotations

import math

from bench.report_pace import _row_b9
from bench.scenarios.b9_human_pace import judge, latest, lateness, rate_ratio


def test_a_number_that_sends_the_moment_each_slot_opens_keeps_its_policys_rate() -> None:
    # given: sends at 10, 30, 55; after each the product wrote the next slot (30, then 55) as the send ended
    slots = [(10.0, 0.0), (30.0, 10.2), (55.0, 30.2)]
    sends = [10.0, 30.0, 55.0]

    # then
    assert rate_ratio(slots, sends, 0.0, 100.0) == 1.0
    assert lateness(slots, sends, 0.0, 100.0) == [0.0, 0.0, 0.0]


def test_late_sends_lower_the_rate_and_show_as_lateness() -> None:
    # given: each send 2 s after its slot
    slots = [(10.0, 0.0), (30.0, 12.2), (50.0, 32.2)]
    sends = [12.0, 32.0, 52.0]

    # then: allowed gaps 18 + 18 over actual 20 + 20
    assert rate_ratio(slots, sends, 0.0, 100.0) == 0.9
    assert lateness(slots, sends, 0.0, 100.0) == [2.0, 2.0, 2.0]


def test_a_slot_never_sent_is_infinitely_late_and_a_starved_number_counts_zero() -> None:
    slots = [(10.0, 0.0), (30.0, 10.2)]
    assert lateness(slots, [10.0], 0.0, 100.0) == [0.0, math.inf]
    assert rate_ratio(slots, [10.0], 0.0, 100.0) == 0.0


def test_only_the_window_counts() -> None:
    slots = [(10.0, 0.0), (30.0, 15.2), (50.0, 30.2)]
    sends = [15.0, 30.0, 50.0]  # the first send, before the window, was late
    assert rate_ratio(slots, sends, 20.0, 100.0) == 1.0
    assert lateness(slots, sends, 20.0, 100.0) == [0.0, 0.0]


def test_judge_takes_the_slowest_number_and_the_row_says_what_was_met() -> None:
    slots = {"a": [(10.0, 0.0), (30.0, 10.2), (50.0, 30.2)], "b": [(10.0, 0.0), (30.0, 12.2), (50.0, 32.2)]}
    sends = {"a": [10.0, 30.0, 50.0], "b": [12.0, 32.0, 52.0]}
    figures = judge(slots, sends, ["a", "b"], 0.0, 100.0, 0.0)
    assert figures["rate_ratio"]["min"] == 0.9 and figures["below_target"] == 0
    assert figures["lateness_ms"]["max"] == 2000.0 and figures["unsent_slots"] == 0

    b9 = {**figures, "sends_per_s": 40.0, "time_scale": 10.0, "stack_ms_per_message": 30.0,
          "b2_stack_ms_per_message": 20.0, "cpu_ratio": 1.5, "met": False, "rate_met": True, "lateness_met": False,
          "cpu_met": False}
    row = _row_b9(b9)[0]
    assert row.startswith("| B9 | 2 unofficial numbers at 40.0 sends/s")
    assert "**not met** (rate met, lateness not met, CPU not met)" in row

    # Judged against B2's pipeline fed at B9's rate, B2 at full speed shown beside it
    same = {"sends_per_s": 25.0, "stack_ms_per_message": 24.0, "sent_in_window": 1500, "window_s": 60.0,
            "cpu_ms_per_message": {"relay": 1.0}}
    row = _row_b9({**b9, "b2_at_rate": same, "same_rate_cpu_ratio": 1.25, "cpu_judged_at": "same_rate"})[0]
    assert "| B2's pipeline fed at B9's rate (25.0/s): 24.0 ms per message; at full speed, before and after: 20.0 ms" in row
    assert "| CPU 1.25× (B2 at full speed: 1.50×) |" in row
    assert "CPU ≤ 1.25× B2's pipeline at the same rate |" in row


def test_the_latest_slots_come_first_with_their_sends() -> None:
    slots = {"a": [(10.0, 0.0), (30.0, 10.2)], "b": [(10.0, 0.0), (30.0, 12.2)]}
    sends = {"a": [10.0, 30.5], "b": [12.0, 30.1]}
    assert latest(slots, sends, 0.0, 100.0, count=2) == [("b", 10.0, 12.0), ("a", 30.0, 30.5)]
