"""Every long-running process keeps what it built while starting out of the garbage collector's work
(pilot_status.collector): a full collection then walks only what the process made since."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import worker_process_init, worker_ready
from django.core.management import call_command
from django.test import override_settings

from pilot_status import celery
from pilot_status.collector import freeze_startup_objects


class Started(Exception):
    """Raised where a process freezes its start-up objects: it got that far, and goes no further in a test."""


class Thing:
    """An object the collector tracks (a dict of plain values, for one, it does not)."""


@pytest.fixture
def frozen_here() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_what_exists_when_a_process_has_started_is_left_out_of_every_collection(frozen_here: None) -> None:
    # given: objects made while "starting"
    started = [Thing() for _ in range(10_000)]

    # when
    assert gc.is_tracked(started[0])
    frozen = freeze_startup_objects()

    # then: they are all frozen, out of the generations a collection walks; what comes later is not
    made_later = Thing()
    collected = {id(o) for o in gc.get_objects()}
    assert frozen >= len(started)
    assert not any(id(o) in collected for o in started)
    assert id(made_later) in collected


@pytest.mark.parametrize("signal", [worker_ready, worker_process_init], ids=["ready", "pool child"])
def test_a_celery_worker_freezes_once_it_is_set_up(signal: Any) -> None:
    receivers = [ref() if isinstance(ref, weakref.ref) else ref for _, ref in signal.receivers]
    assert celery._freeze_startup_objects in receivers


@pytest.mark.parametrize("command, module", [
    ("run_relay", "messaging.management.commands.run_relay"),
    ("run_consumer", "ingestion.management.commands.run_consumer"),
])
def test_the_relay_and_the_consumer_freeze_before_they_serve(
        command: str, module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def started() -> int:
        raise Started

    monkeypatch.setattr(f"{module}.freeze_startup_objects", started)
    with override_settings(EVOLUTION_RABBITMQ_URL="amqp://guest:guest@127.0.0.1:1//"), pytest.raises(Started):
        call_command(command)


@pytest.mark.parametrize("app", ["pilot_status.wsgi", "pilot_status.internal_wsgi"])
def test_a_gunicorn_worker_freezes_once_its_application_is_built(app: str) -> None:
    # A process of its own: importing the application is what a gunicorn worker does after it forks.
    out = subprocess.run(
        [sys.executable, "-c", f"import gc, {app}; print(gc.get_freeze_count())"],
        capture_output=True, text=True, timeout=120, env=os.environ.copy(), check=True,
    )
    assert int(out.stdout.split()[-1]) > 10_000
