"""The `stack` marker stays honest (tests/support/stack_guard.py): `make test-fast` leaves out the tests that
start stack processes, so a test that starts one without the marker fails."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from pilot_status import topology
from pilot_status.lane_worker import settings_for as lane_worker_settings
from tests.support import stack_guard
from tests.support.processes import simulator_site


@pytest.mark.parametrize("name", [p.name for p in topology.PROCESSES])
def test_every_process_of_the_topology_is_a_stack_process(name: str) -> None:
    site = topology.stack_site(8000, 8001)
    assert stack_guard.stack_program(topology.process(name).command(site)) is not None
    assert stack_guard.stack_program(topology.shell(topology.process(name).command(topology.PROCFILE))) is not None


def test_the_test_stacks_lane_workers_and_simulator_are_stack_processes(settings: Any) -> None:
    for lane in ("otp", "utility", "marketing"):  # as tests/support/processes.py's Stack runs them
        argv = topology.lane_worker_command(lane_worker_settings(lane, {}), topology.stack_site(1))
        assert stack_guard.stack_program(argv) == "celery worker"
    assert stack_guard.stack_program(topology.process("simulator").command(simulator_site(1))) == "python -m simulator"
    assert stack_guard.stack_program([sys.executable, "-m", "bench", "--smoke"]) == "python -m bench"
    assert stack_guard.stack_program([sys.executable, "manage.py", "run_consumer"]) == "manage.py run_consumer"


@pytest.mark.parametrize("argv", [
    [sys.executable, "-c", "import django; django.setup()"],
    [sys.executable, "manage.py", "check"],
    ["bash", "scripts/services.sh", "rabbitmqctl", "list_vhosts"],
    [sys.executable, "-m", "pilot_status.topology", "procfile"],
    "git ls-files",
])
def test_short_commands_are_not(argv: Any) -> None:
    assert stack_guard.stack_program(argv) is None


def test_a_test_without_the_marker_cannot_start_one(monkeypatch: pytest.MonkeyPatch) -> None:
    unmarked = SimpleNamespace(nodeid="tests/x.py::test_y", get_closest_marker=lambda name: None)
    monkeypatch.setattr(stack_guard, "_running", unmarked)
    with pytest.raises(stack_guard.UnmarkedStackTest, match=r"tests/x.py::test_y starts a stack process \(python -m gunicorn\)"):
        subprocess.Popen([sys.executable, "-m", "gunicorn", "--version"])
    assert subprocess.run([sys.executable, "-c", "pass"], check=True).returncode == 0  # anything else starts


@pytest.mark.stack
def test_a_test_with_the_marker_can() -> None:
    done = subprocess.run([sys.executable, "-m", "gunicorn", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "gunicorn" in done.stdout


@pytest.mark.stack
def test_a_stack_that_fails_to_start_leaves_nothing_running(simulator_process: Any) -> None:
    """The fixture's stop() is never reached when start() raises, so start() stops what it started: else
    the web, relay and workers outlive the test and take later tests' (or another checkout's) messages."""
    from tests.support.processes import Process, Stack

    stack = Stack(simulator_process)
    # The consumer is the last one start() waits for: by then the web, relay and lane workers are up.
    stack._consumer = lambda: Process("consumer", [sys.executable, "-c", "raise SystemExit(3)"], stack.env)  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="exited with 3"):
            stack.start()
        assert stack.processes, "start() made its processes"
        assert [name for name, process in stack.processes.items() if process.alive()] == []
    finally:
        stack.stop()
