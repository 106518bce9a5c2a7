"""The paired in-process measurement (bench/paired.py): its rule, its table, and a real `--paired --smoke` run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.launcher import ROOT
from bench.paired import DEVICES, render, verdict


def test_a_device_earns_its_place_when_its_median_cost_passes_5_percent_and_no_round_reads_it_cheaper_off() -> None:
    assert verdict([1.15, 1.20, 1.01, 1.18]) == "earns its place"
    assert verdict([1.15, 1.20, 0.99, 1.18]) == "removable"  # one round cheaper off: the sign is not shown
    assert verdict([1.04, 1.03, 1.06, 1.02]) == "removable"  # shown, but under 5 %
    assert verdict([1.5, 1.5, 1.5]) == "removable"  # too few rounds to say


def test_the_table_gives_each_device_its_cpu_on_and_off_and_its_ratios() -> None:
    side = {"python": 1.5, "postgres": 0.5}
    result = {"rounds": 4, "accepts_per_block": 1000, "devices": [
        {"device": "second validator", "setting": "SEND_PLAIN_VALIDATOR=0", "unit": "accept", "on": [side] * 4,
         "off": [{"python": 1.9, "postgres": 0.5}] * 4, "ratios": [1.1, 1.2, 1.2, 1.3], "median_ratio": 1.2,
         "verdict": "earns its place"}]}

    row = render(result).splitlines()[-1]

    assert row == ("| second validator | `SEND_PLAIN_VALIDATOR=0` | 2.000 → 2.400 ms per accept | 1.200× (1.100–1.300) "
                   "| +20.0 % (+10.0 to +30.0) of B1's CPU per accept | **earns its place** |")


@pytest.mark.harness
@pytest.mark.stack
@pytest.mark.timeout(300)
def test_a_smoke_run_measures_every_device_on_and_off_against_a_bench_database_of_its_own(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["BENCH_DATABASE_NAME"] = f"{env.get('TEST_DATABASE_NAME', 'test_pilot_status')}_bench_paired_smoke"
    out, raw = tmp_path / "paired.md", tmp_path / "paired.json"

    done = subprocess.run([sys.executable, "-m", "bench", "--paired", "--smoke", "--out", str(out), "--json", str(raw)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    result = json.loads(raw.read_text())
    assert [d["device"] for d in result["devices"]] == [d.name for d in DEVICES]
    for device in result["devices"]:
        assert len(device["ratios"]) == result["rounds"] == 2
        for side in device["on"] + device["off"]:
            assert side["python"] > 0 and side["postgres"] > 0  # the backend's CPU was counted too
    assert out.read_text().count("| `") == len(DEVICES)
