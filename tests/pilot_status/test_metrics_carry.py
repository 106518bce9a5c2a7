"""Counts wait in their process for METRICS_FLUSH_SECONDS and reach Redis together, once each."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from celery.signals import worker_process_shutdown

from pilot_status import metrics
from tests.support.simulator import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def own_carry(monkeypatch: Any) -> None:
    # A carry per test: an earlier test's flusher thread must not send this one's counts early.
    monkeypatch.setattr(metrics, "_carry", metrics._Carry())


@pytest.fixture
def name() -> Iterator[str]:
    key = f"{metrics.PREFIX}test:carry:{uuid.uuid4().hex}"
    yield key
    metrics.redis().delete(key)


def value(key: str) -> int:
    return int(metrics.redis().get(key) or 0)


def test_counts_wait_then_arrive_summed(settings: Any, name: str) -> None:
    settings.METRICS_FLUSH_SECONDS = 0.3
    for _ in range(5):
        metrics.incr(name)
    metrics.incr(name, 10)
    assert value(name) == 0  # still in this process
    assert wait_until(lambda: value(name) == 15, timeout=5)
    time.sleep(0.7)  # later flushes send nothing again
    assert value(name) == 15


def test_flush_and_reading_the_counters_send_at_once(settings: Any, name: str) -> None:
    settings.METRICS_FLUSH_SECONDS = 30
    metrics.incr(name, 2)
    metrics.flush()
    assert value(name) == 2
    metrics.incr(name, 3)
    assert metrics.read_all()[name] == 5  # the metrics endpoints see this process's own counts


def test_zero_sends_each_count_at_once(settings: Any, name: str) -> None:
    settings.METRICS_FLUSH_SECONDS = 0
    metrics.incr(name, 4)
    assert value(name) == 4
    metrics.evolution("test:carry:zero")  # the helpers go the same way
    metrics.messages("test:carry:zero")
    assert metrics._carry._pending == {} and metrics._carry._owner == 0  # nothing carried, no flusher


def test_zero_in_a_process_starts_no_carry_thread(name: str) -> None:
    # METRICS_FLUSH_SECONDS=0 (issue 25's switch) as a process reads it from its environment: every count
    # is in Redis when incr returns, and no flusher thread ever starts.
    code = (
        "import threading, django; django.setup()\n"
        "from pilot_status import metrics\n"
        "for n in range(3):\n"
        f"    metrics.incr({name!r}, 2)\n"
        f"    assert int(metrics.redis().get({name!r})) == 2 * (n + 1)\n"
        "assert not [t for t in threading.enumerate() if t.name == 'metrics-flush']\n"
        "import os; os._exit(0)\n"  # no atexit flush: what Redis holds was sent at once
    )
    env = {**os.environ, "METRICS_FLUSH_SECONDS": "0", "DJANGO_SETTINGS_MODULE": "pilot_status.settings"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert value(name) == 6


def test_counts_refused_by_redis_are_kept_for_the_next_flush(settings: Any, name: str, monkeypatch: Any) -> None:
    settings.METRICS_FLUSH_SECONDS = 30
    metrics.incr(name, 7)
    # Nothing listens on port 1: the flush fails as it does while Redis is down.
    unreachable = redis_py.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    with monkeypatch.context() as patched:
        patched.setattr(metrics, "redis", lambda: unreachable)
        metrics.flush()
        metrics.incr(name, 1)
    assert value(name) == 0
    metrics.flush()
    assert value(name) == 8


def test_a_forked_child_does_not_send_its_parents_counts(settings: Any, name: str) -> None:
    settings.METRICS_FLUSH_SECONDS = 30
    metrics.incr(name, 5)
    pid = os.fork()
    if pid == 0:  # the child (a Celery pool process, a gunicorn worker)
        try:
            metrics.incr(name, 1)
            metrics.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert value(name) == 1
    metrics.flush()
    assert value(name) == 6


def test_a_pool_process_sends_its_counts_when_it_shuts_down(settings: Any, name: str) -> None:
    settings.METRICS_FLUSH_SECONDS = 30
    metrics.incr(name, 3)
    worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
    assert value(name) == 3


def test_a_process_that_exits_cleanly_sends_its_counts(name: str) -> None:
    code = (
        "import django; django.setup()\n"
        "from pilot_status import metrics\n"
        f"metrics.incr({name!r}, 9)\n"
        "raise SystemExit(0)\n"
    )
    env = {**os.environ, "METRICS_FLUSH_SECONDS": "30", "DJANGO_SETTINGS_MODULE": "pilot_status.settings"}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=60)
    assert value(name) == 9
