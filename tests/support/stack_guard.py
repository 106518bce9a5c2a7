"""Keeps the `stack` marker honest: a test that starts a stack process without it fails.

`make test-fast` runs the tests not marked `stack` (pytest.ini), so the marker must be on every test that
starts a web, webhook, relay, consumer, Celery worker or beat, a simulator, or the bench or chaos harness.
tests/support/plugin.py marks the tests that use a process-starting fixture; a test that starts one itself
carries the mark in its module. Every process started through `subprocess` (Popen, run, asyncio's) is
checked here against the test running at the time, in every run, `make test` included.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from typing import Any

# The product's long-running management commands (`python manage.py NAME`).
SERVING_COMMANDS = {"run_relay", "run_consumer"}
# `python -m NAME` for the harnesses and launchers that run a stack or one of its processes.
SERVING_MODULES = {"gunicorn", "simulator", "bench", "chaos", "pilot_status.lane_worker"}

_running: Any = None  # the pytest item being set up, run or torn down (tests/support/plugin.py)


def stack_program(argv: str | bytes | os.PathLike[str] | Sequence[Any]) -> str | None:
    """What stack process `argv` starts ("gunicorn", "celery worker", ...), or None."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        words = shlex.split(os.fsdecode(argv))
    else:
        words = [os.fsdecode(word) for word in argv]
    names = [os.path.basename(word) for word in words]
    for i, name in enumerate(names):
        if name == "gunicorn":
            return "gunicorn"
        if name == "celery" and ("worker" in names[i:] or "beat" in names[i:]):
            return "celery " + ("worker" if "worker" in names[i:] else "beat")
        if name == "-m" and i + 1 < len(names):
            module = words[i + 1]
            if module in SERVING_MODULES:
                return f"python -m {module}"
            if module == "celery" and ("worker" in names[i:] or "beat" in names[i:]):
                return "celery " + ("worker" if "worker" in names[i:] else "beat")
        if name == "manage.py" and i + 1 < len(names) and words[i + 1] in SERVING_COMMANDS:
            return f"manage.py {words[i + 1]}"
    return None


def set_running(item: Any) -> None:
    global _running
    _running = item


class UnmarkedStackTest(Exception):
    pass


_original = subprocess.Popen._execute_child  # type: ignore[attr-defined]


def _checked_execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
    item = _running
    if item is not None and item.get_closest_marker("stack") is None:
        program = stack_program(args)
        if program is not None:
            raise UnmarkedStackTest(
                f"{item.nodeid} starts a stack process ({program}) but is not marked `stack`: mark it "
                "(pytestmark = pytest.mark.stack), so that `make test-fast` leaves it out")
    return _original(self, args, *rest, **kwargs)


def install() -> None:
    subprocess.Popen._execute_child = _checked_execute_child  # type: ignore[attr-defined]
