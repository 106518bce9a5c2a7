"""Every long-running process writes a heartbeat (issue 24): the real relay, consumer, a Celery worker and
beat appear on the status page; a killed relay turns stale there and fails `heartbeat_check`; one stopped
cleanly leaves the page."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

from pilot_status import heartbeats
from tests.support import processes as support
from tests.support.processes import Process, stop_all
from tests.support.simulator import wait_until

pytestmark = pytest.mark.stack
BEAT_EVERY = "0.5"


@pytest.fixture
def env() -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": support.test_database_url(),
        "HEARTBEAT_SECONDS": BEAT_EVERY,
        # The test process TRUNCATEs between tests while these run (tests/support/processes.py: why).
        "DATABASE_LOCK_TIMEOUT_MS": "300",
        "PYTHONUNBUFFERED": "1",
        # Beat's entries far apart: it starts and beats, but sends no maintenance task during the test.
        **{name: "3600" for name in ("RECONCILE_SECONDS", "STATUS_SYNC_SECONDS", "INSTANCE_POLL_SECONDS",
                                     "INGESTION_RECONCILE_SECONDS", "RETENTION_SECONDS")},
    }


@pytest.fixture
def started() -> Iterator[list[Process]]:
    running: list[Process] = []
    yield running
    stop_all(running)


def beats() -> dict[str, dict[str, Any]]:
    return {beat["process"]: beat for beat in heartbeats.processes()}


def check(name: str) -> tuple[bool, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("heartbeat_check", "--process", name, stdout=out, stderr=err)
    except SystemExit as exit:
        assert exit.code == 1
        return False, err.getvalue()
    return True, out.getvalue()


def test_a_killed_relay_turns_stale_and_a_stopped_one_leaves(
    transactional_db: Any, client: Any, env: dict[str, str], started: list[Process], settings: Any
) -> None:
    settings.HEARTBEAT_STALE_SECONDS = 2.0
    relay = Process("heartbeat-relay", [sys.executable, "manage.py", "run_relay", "--lanes", "otp"], env).start()
    started.append(relay)
    wait_until(lambda: "relay:otp" in beats(), timeout=30, interval=0.2, message="the relay's heartbeat")
    first = beats()["relay:otp"]["at"]
    wait_until(lambda: beats()["relay:otp"]["at"] > first, timeout=10, interval=0.2, message="a second beat")
    assert beats()["relay:otp"]["stale"] is False
    assert check("relay:otp")[0]
    assert beats()["relay:otp"]["pid"] == relay.proc.pid  # type: ignore[union-attr]

    relay.kill(signal.SIGKILL)
    wait_until(lambda: beats()["relay:otp"]["stale"], timeout=10, interval=0.2, message="the killed relay to turn stale")
    ok, said = check("relay:otp")
    assert not ok and "relay:otp" in said and "old" in said
    # ... and so does the status page.
    page = client.get("/api/internal/status", HTTP_X_INTERNAL_WEBHOOK_SECRET=settings.INTERNAL_WEBHOOK_SECRET).json()
    assert page["processes"]["stale"] == ["relay:otp"]
    [listed] = page["processes"]["list"]
    assert listed["stale"] is True and listed["age_seconds"] >= settings.HEARTBEAT_STALE_SECONDS

    # A relay stopped on purpose (SIGTERM) removes its own heartbeat: nothing stale is left behind.
    again = Process("heartbeat-relay", [sys.executable, "manage.py", "run_relay", "--lanes", "otp"], env).start()
    started.append(again)
    wait_until(lambda: any(b["pid"] == again.proc.pid for b in heartbeats.processes()),  # type: ignore[union-attr]
               timeout=30, interval=0.2, message="the new relay's heartbeat")
    again.stop()
    assert all(beat["pid"] != again.proc.pid for beat in heartbeats.processes())  # type: ignore[union-attr]


def test_the_consumer_a_worker_and_beat_beat(
    transactional_db: Any, env: dict[str, str], started: list[Process]
) -> None:
    celery = [sys.executable, "-m", "celery", "-A", "pilot_status"]
    started.extend(process.start() for process in (
        Process("heartbeat-consumer", [sys.executable, "manage.py", "run_consumer"], env),
        Process("heartbeat-worker", [*celery, "worker", "-Q", "bulk", "-n", "bulk@heartbeat-test", "-c", "1",
                                      "--without-gossip", "--without-mingle", "--without-heartbeat"], env),
        Process("heartbeat-beat", [*celery, "beat", "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler",
                                   "-s", "/dev/null"], env),
    ))
    expected = {"consumer", "worker:bulk", "beat"}
    wait_until(lambda: expected <= set(beats()), timeout=60, interval=0.5,
               message=f"heartbeats of {expected} (logs in {support.LOG_DIR})")
    found = beats()
    assert not any(found[name]["stale"] for name in expected)
    for name in expected:
        assert check(name)[0], name
    assert not check("worker:otp")[0]  # none runs here
    # compose's form of the check, without Django
    for name, status in (("worker:bulk", 0), ("worker:otp", 1)):
        light = subprocess.run([sys.executable, "-m", "pilot_status.heartbeat_check", "--process", name],
                               env=env, capture_output=True, text=True, timeout=30)
        assert light.returncode == status, (name, light.stdout, light.stderr)

    # Stopped cleanly (SIGTERM, as compose and honcho stop them), each leaves the page.
    stop_all(started, timeout=30)
    assert not expected & set(beats()), beats()
