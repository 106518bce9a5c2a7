"""The benchmark harness, run end to end on tiny sizes so that it cannot rot.

It starts its own real stack (bench/launcher.py) on its own database and writes a report; this test
only checks that every scenario completed and produced well-formed figures. It asserts no speed:
benchmarks measure, tests do not time.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9")

# A whole harness run in a subprocess (its own stack, at smoke sizes): about 2.5 minutes on an idle 2-core
# machine, more on a loaded one. pytest.ini's 180 s would interrupt it and leave its stack's processes
# running on the test broker, where they take the next stack tests' tasks; the subprocess's own timeout
# (below) is the bound.
pytestmark = [pytest.mark.timeout(960), pytest.mark.harness, pytest.mark.stack]


def _is_figure(value: object) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def test_it_runs_every_scenario_on_tiny_sizes_and_writes_a_report(tmp_path: Path) -> None:
    # given: a bench database of its own, next to the test database
    env = dict(os.environ)
    env["BENCH_DATABASE_NAME"] = f"{env.get('TEST_DATABASE_NAME', 'test_pilot_status')}_bench_smoke"
    # B4's breakers open on its outage's 503s; at the default 30 s the smoke's 2 s outage (b4_outage_seconds)
    # drained only once they closed, 29 s later. This test checks that B4 drains, not when: 3 s (chaos runs at 5).
    env["BREAKER_OPEN_SECONDS"] = "3"
    out, raw = tmp_path / "benchmarks.md", tmp_path / "results.json"

    # when
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out), "--json", str(raw)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )

    # then: every scenario ran, nothing failed, and each headline figure is a number
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    results = json.loads(raw.read_text())
    assert results["errors"] == {}
    assert sorted(results["scenarios"]) == list(SCENARIOS)
    sc = results["scenarios"]
    assert _is_figure(sc["B1"]["figures"]["funnel"]["rate"]["median"])
    assert _is_figure(sc["B1"]["figures"]["baseline"]["rate"]["median"])
    assert _is_figure(sc["B1"]["figures"]["baseline_wide"]["rate"]["median"])  # the pool-size cross-check
    assert _is_figure(sc["B1"]["ratio_to_best_baseline"])
    assert sc["B1"]["every_202_stored"] is True
    assert _is_figure(sc["B2"]["sent_rate"]["median"]) and _is_figure(sc["B2"]["baseline_tasks_per_s"]["median"])
    assert all(r["all_sent"] and r["all_read"] for r in sc["B2"]["runs"])
    alone = sc["B2"]["sends_alone"]  # the send path's ceiling: every message SENT with no receipt emitted
    assert alone["all_sent"] and _is_figure(alone["sent_rate"])
    assert alone["receipts_emitted"] == {"webhook": 0, "rabbitmq": 0}
    assert set(sc["B2"]["peak_rss_mb"]) >= {"web", "worker", "relay", "consumer", "simulator"}
    beside = sc["B2"]["with_otps"]  # another tenant's OTPs beside each run: the pair's figures are numbers
    assert [r["all_sent"] and r["otps_all_sent"] and r["stream_error"] is None for r in beside["runs"]] == [True]
    assert beside["runs"][0]["otps"] > 0 and _is_figure(beside["ratio"]["median"])
    assert _is_figure(beside["otp_cpu_share"]["median"]) and _is_figure(beside["runs"][0]["otp_cpu_ms"])
    assert _is_figure(sc["B3"]["idle"]["p99_ms"]["median"]) and _is_figure(sc["B3"]["backlog_run"]["p99_ms"]["median"])
    assert sc["B3"]["gateway_nice"] in (-10, 0)  # the simulator at B8's priority for B3 too, where root may raise it
    assert sc["B4"]["drained"] is True and isinstance(sc["B4"]["attempts_consumed_during_outage"], int)
    assert sc["B5"]["correct"] is True and _is_figure(sc["B5"]["rate"]["median"])
    assert all(r["all_sent"] for r in sc["B6"]["alone"]["runs"] + sc["B6"]["behind"]["runs"])
    assert sc["B7"]["all_delivered"] and _is_figure(sc["B7"]["deliveries_per_s"]["median"])
    b8 = sc["B8"]["runs"]  # each pool at each latency, side by side
    assert sorted({r["pool"] for r in b8}) == ["prefork", "threads"]
    assert all(_is_figure(r["throughput_per_s"]) and isinstance(r["max_in_flight"], int) for r in b8)
    assert all(set(r["peak_db_connections"]) >= {"worker", "web"} and r["peak_rss_mb"]["worker"] > 0 for r in b8)
    # the OTPs judged with the simulator's lateness taken off each call: never more than as measured
    assert all(r["otp_p99_punctual_ms"] <= r["otp_p99_ms"] for r in b8)
    # the CPU ceiling measured right before each threads run and after the last, each run judged against the mean
    # of the two around it
    ceilings = [c["throughput_per_s"] for c in sc["B8"]["ceilings"]]
    caps = sc["B8"]["ceilings"][0]["pacing_caps_per_s"]
    threads = [r for r in b8 if r["pool"] == "threads"]
    assert len(ceilings) == len(threads) + 1
    for r in threads:
        before, after = r["ceilings_around"]
        assert after == before + 1 and r["bar_per_s"] == min(caps, round((ceilings[before] + ceilings[after]) / 2, 1))
    assert "threads (ceiling: typing off)" in out.read_text()
    b9 = sc["B9"]  # unofficial numbers at a compressed human pace, judged against the slots their schedules allowed
    assert b9["slots"] > 0 and b9["sent_in_window"] > 0
    assert _is_figure(b9["rate_ratio"]["min"]) and _is_figure(b9["lateness_ms"]["p99"]) and _is_figure(b9["cpu_ratio"])
    assert b9["other_holds"] == {}  # the gap alone held the numbers
    report = out.read_text()
    for row in (*SCENARIOS, "M"):
        assert f"| {row} |" in report
    assert "Smoke run" in report
    assert "Sends alone, the send path's measured ceiling" in report
    # the stack ran with the Procfile's priorities, and the report says so
    assert results["stack"]["priorities"]["worker-marketing"] == results["stack"]["priorities"]["webhook"] > 0
    assert "worker-otp" not in results["stack"]["priorities"]
    assert ("Priorities as in the Procfile: consumer, relay, webhook, worker-callbacks, worker-callbacks-relay, worker-marketing, "
            "worker-utility at nice") in report
