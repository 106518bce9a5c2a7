"""Lane workers run Celery's threads pool, sized per lane, and every launcher starts them alike (issue 26)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from messaging.sending import budget
from pilot_status import lane_worker
from pilot_status.lane_worker import LANES, settings_for
from tests.support.processes import Stack

ROOT = Path(__file__).resolve().parents[2]


def test_by_default_the_lanes_run_threads_sized_for_their_wait_on_evolution():
    workers = {lane: settings_for(lane, {}) for lane in LANES}
    assert {w.pool for w in workers.values()} == {"threads"}
    assert {lane: w.concurrency for lane, w in workers.items()} == {"otp": 64, "utility": 384, "marketing": 384}
    # Postgres budget: the threads share a pool of 8 per lane process, whatever their number.
    assert {w.db_connections for w in workers.values()} == {8}
    assert workers["utility"].env() == {"DATABASE_POOL_MAX_SIZE": "8"}


def test_a_lane_setting_wins_over_the_common_one_and_prefork_keeps_its_old_size():
    env = {"LANE_WORKER_CONCURRENCY": "8", "LANE_WORKER_CONCURRENCY_OTP": "4"}
    assert settings_for("otp", env).concurrency == 4
    assert settings_for("marketing", env).concurrency == 8
    assert settings_for("utility", {"LANE_WORKER_POOL": "prefork"}) == lane_worker.LaneWorker("utility", "prefork", 2)
    assert settings_for("utility", {"LANE_WORKER_POOL": "prefork"}).env() == {}  # one connection per process
    assert settings_for("otp", {"LANE_WORKER_DB_CONNECTIONS": "3"}).db_connections == 3


@pytest.mark.parametrize("env, named", [
    ({"LANE_WORKER_POOL": "gevent"}, "LANE_WORKER_POOL"),
    ({"LANE_WORKER_CONCURRENCY": "0"}, "LANE_WORKER_CONCURRENCY"),
    ({"LANE_WORKER_CONCURRENCY_UTILITY": "ten"}, "LANE_WORKER_CONCURRENCY_UTILITY"),
    ({"LANE_WORKER_CONCURRENCY": "100000"}, "LANE_WORKER_CONCURRENCY"),
    ({"LANE_WORKER_DB_CONNECTIONS": "0"}, "LANE_WORKER_DB_CONNECTIONS"),
])
def test_a_bad_setting_is_refused_by_name(env, named):
    with pytest.raises(ValueError, match=named):
        settings_for("utility", env)


def test_the_celery_arguments_name_the_pool_and_its_size():
    args = settings_for("marketing", {}).celery_args(hostname="marketing@x")
    assert args[:7] == ["-A", "pilot_status", "worker", "-Q", "marketing", "-n", "marketing@x"]
    assert args[args.index("-P") + 1] == "threads" and args[args.index("-c") + 1] == "384"
    assert "-O" not in args  # `fair` is a prefork scheduling option
    assert "-O" in settings_for("marketing", {"LANE_WORKER_POOL": "prefork"}).celery_args()


@pytest.mark.stack
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


POOLED_THREADS = """
import threading, time, django
django.setup()
from django.db import connection
from pilot_status.database import release_while_waiting

done = []

def send():
    connection.cursor().execute("SELECT 1")  # the claim
    release_while_waiting()                  # the wait on Evolution
    time.sleep(0.3)
    connection.cursor().execute("SELECT 1")  # recording the answer
    done.append(connection.pool.get_stats()["pool_size"])
    connection.close()

threads = [threading.Thread(target=send) for _ in range(12)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(done), max(done), connection.pool.timeout)
"""


def test_threads_waiting_on_evolution_share_a_bounded_pool_of_connections():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "pilot_status.settings", "DATABASE_POOL_MAX_SIZE": "3"}
    done = subprocess.run([sys.executable, "-c", POOLED_THREADS], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    finished, largest_pool, wait = done.stdout.split()
    assert int(finished) == 12 and int(largest_pool) <= 3  # twelve sends in flight at once on three connections
    # The longest wait for a free connection is part of a send's worst case, which the lease outlives.
    assert float(wait) == budget.DB_POOL_WAIT_SECONDS
    assert budget.send_seconds(3.0, 15.0, 3000) >= 3 + 15 + 3 + budget.DB_POOL_WAIT_SECONDS
