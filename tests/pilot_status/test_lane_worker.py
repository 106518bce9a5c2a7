"""Lane workers run Celery's threads pool, sized per lane, and every launcher starts them alike (issue 26)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pilot_status import lane_worker
from pilot_status.lane_worker import LANES, settings_for
from tests.support.processes import Stack

ROOT = Path(__file__).resolve().parents[2]


def test_by_default_the_lanes_run_threads_sized_for_their_wait_on_evolution():
    workers = {lane: settings_for(lane, {}) for lane in LANES}
    assert {w.pool for w in workers.values()} == {"threads"}
    assert {lane: w.concurrency for lane, w in workers.items()} == {"otp": 16, "utility": 32, "marketing": 32}
    # Postgres budget: one connection per thread, well under half of max_connections 200.
    assert sum(w.concurrency for w in workers.values()) <= 100


def test_a_lane_setting_wins_over_the_common_one_and_prefork_keeps_its_old_size():
    env = {"LANE_WORKER_CONCURRENCY": "8", "LANE_WORKER_CONCURRENCY_OTP": "4"}
    assert settings_for("otp", env).concurrency == 4
    assert settings_for("marketing", env).concurrency == 8
    assert settings_for("utility", {"LANE_WORKER_POOL": "prefork"}) == lane_worker.LaneWorker("utility", "prefork", 2)


@pytest.mark.parametrize("env, named", [
    ({"LANE_WORKER_POOL": "gevent"}, "LANE_WORKER_POOL"),
    ({"LANE_WORKER_CONCURRENCY": "0"}, "LANE_WORKER_CONCURRENCY"),
    ({"LANE_WORKER_CONCURRENCY_UTILITY": "ten"}, "LANE_WORKER_CONCURRENCY_UTILITY"),
    ({"LANE_WORKER_CONCURRENCY": "100000"}, "LANE_WORKER_CONCURRENCY"),
])
def test_a_bad_setting_is_refused_by_name(env, named):
    with pytest.raises(ValueError, match=named):
        settings_for("utility", env)


def test_the_celery_arguments_name_the_pool_and_its_size():
    args = settings_for("marketing", {}).celery_args(hostname="marketing@x")
    assert args[:7] == ["-A", "pilot_status", "worker", "-Q", "marketing", "-n", "marketing@x"]
    assert args[args.index("-P") + 1] == "threads" and args[args.index("-c") + 1] == "32"
    assert "-O" not in args  # `fair` is a prefork scheduling option
    assert "-O" in settings_for("marketing", {"LANE_WORKER_POOL": "prefork"}).celery_args()


def test_an_unknown_lane_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "pilot_status.lane_worker", "maintenance"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no lane 'maintenance'" in done.stderr


def test_every_launcher_starts_the_lane_workers_through_it():
    procfile = dict(line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines()
                    if line and not line.startswith("#"))
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for lane in LANES:
        assert procfile[f"worker_{lane}"].rstrip().endswith(f"python -m pilot_status.lane_worker {lane}")
        assert services[f"worker-{lane}"]["command"] == ["python", "-m", "pilot_status.lane_worker", lane]
        assert "celery" not in procfile[f"worker_{lane}"]
    stack = Stack.__new__(Stack)
    stack.env = {}
    assert stack.lane_worker("utility") == settings_for("utility", {})
