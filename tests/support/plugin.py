"""The suite's phases and markers (pytest.ini loads this with `-p`, before pytest-django reads the settings).

Markers (pytest.ini):
- `stack`: starts stack processes (web, relay, workers, beat, consumer, simulator, a harness). Tests that
  use a fixture that starts them are marked here; a test that starts one itself is marked in its module,
  and tests/support/stack_guard.py fails a test that starts one unmarked. `make test-fast` leaves them out.
- `serial`: needs the shared servers to itself: it really stops, restarts or faults Postgres, Redis or
  RabbitMQ, which every worker's tests use too, or it waits for every transaction of the Postgres server
  (transaction ids are the server's, not a database's). It runs in `make test`'s serial phase, alone.
- `harness`: runs the bench or chaos harness end to end: `make bench-check` / `make chaos-check`.
- `slow`: over about a second on its own; `make test-fast` leaves them out (the list: tests/support/slow.py).

`--phase` (scripts/test.sh): `parallel` (everything but `serial` and `harness`, for xdist workers) or
`serial` (the `serial` tests but `harness`). Without it every selected test runs, as one process would run
them all. `make test-fast` adds `-m "not stack and not slow"` to both phases.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support import stack_guard, workers
from tests.support.slow import SLOW

# Fixtures that start stack processes: every test whose fixture closure holds one is a `stack` test.
STACK_FIXTURES = {"stack_process", "simulator_process", "sim", "chaos_run"}
PHASES = ("parallel", "serial")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pilot_status")
    group.addoption("--phase", choices=PHASES, default=None,
                    help="select one phase of the suite (tests/support/plugin.py); default: every selected test")
    group.addoption("--serial-count-file", default=None,
                    help="with --phase=parallel: write here how many selected tests were left for the serial phase")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    worker = workers.worker_id()
    if worker:
        os.environ.update(workers.worker_environment(dict(os.environ), worker))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(PhaseAndOrder(), "pilot_status_phase_and_order")
    stack_guard.install()
    if workers.worker_id():
        workers.ensure_vhosts(dict(os.environ))


def _is_stack(item: pytest.Item) -> bool:
    return item.get_closest_marker("stack") is not None or bool(STACK_FIXTURES & set(getattr(item, "fixturenames", ())))


def _keep(item: pytest.Item, phase: str | None) -> bool:
    marked = {name for name in ("stack", "serial", "harness") if item.get_closest_marker(name) is not None}
    if phase == "parallel":
        return not marked & {"serial", "harness"}
    if phase == "serial":
        return "serial" in marked and "harness" not in marked
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that start stack processes through a fixture, and the slow ones, before `-m` selects by marker."""
    for item in items:
        if _is_stack(item) and item.get_closest_marker("stack") is None:
            item.add_marker(pytest.mark.stack)
        if _is_slow(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


def _is_slow(item: pytest.Item) -> bool:
    path, _, name = item.nodeid.partition("::")
    return name.split("[", 1)[0] in SLOW.get(path, ())


class PhaseAndOrder:
    """The second pass over the collection, after every other plugin's (pytest's `-m` and `-k` included)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
        _select_phase_and_order(config, items)


def _select_phase_and_order(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the phase's tests, and run the tests on the session's stack last.

    Once started, the session's relay and workers keep working on the test database (and write their
    heartbeats): a plain test's committed outbox rows would be released and sent under its feet. Ordering
    keeps the two worlds apart without slowing either down; each xdist worker receives its tests in this
    order, so it starts its own session stack only once it has run every other test it gets.
    """
    phase = config.getoption("phase")
    kept = [item for item in items if _keep(item, phase)]
    left = [item for item in items if not _keep(item, phase)]
    if left:
        config.hook.pytest_deselected(items=left)
    count_file = config.getoption("serial_count_file")
    if phase == "parallel" and count_file:
        later = sum(1 for item in left if item.get_closest_marker("serial") and not item.get_closest_marker("harness"))
        Path(count_file).write_text(f"{later}\n")
    kept.sort(key=lambda item: "stack_process" in getattr(item, "fixturenames", ()))
    items[:] = kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    stack_guard.set_running(item)
    try:
        yield
    finally:
        stack_guard.set_running(None)
