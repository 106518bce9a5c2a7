"""Each pytest-xdist worker's own share of the test servers (tests/support/workers.py)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from django.conf import settings

from tests.support import processes, workers

RUN = {
    "REDIS_URL": "redis://127.0.0.1:56379/1",
    "CELERY_BROKER_URL": "amqp://guest:guest@127.0.0.1:56720/pilot_test",
    "EVOLUTION_RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:56720/pilot_test",
    "SIMULATOR_TEST_RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:56720/",
    "DATABASE_URL": "postgres://pilot:pilot@127.0.0.1:55432/pilot_status",
}


def test_a_worker_gets_its_own_redis_database_and_vhosts_and_keeps_the_rest() -> None:
    assert workers.worker_environment(RUN, "gw3") == {
        "REDIS_URL": "redis://127.0.0.1:56379/5",
        "CELERY_BROKER_URL": "amqp://guest:guest@127.0.0.1:56720/pilot_test_gw3",
        "EVOLUTION_RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:56720/pilot_test_gw3",
        "SIMULATOR_TEST_RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:56720/gw3",
    }
    # Evolution's events on a vhost of their own stay on one of their own
    apart = workers.worker_environment({**RUN, "EVOLUTION_RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:56720/evolution"}, "gw0")
    assert apart["EVOLUTION_RABBITMQ_URL"].endswith("/evolution_gw0") and apart["REDIS_URL"].endswith("/2")


def test_there_are_no_more_workers_than_redis_databases() -> None:
    workers.worker_environment(RUN, f"gw{workers.MAX_WORKERS - 1}")
    with pytest.raises(RuntimeError, match="at most 14 xdist workers"):
        workers.worker_environment(RUN, f"gw{workers.MAX_WORKERS}")


def test_every_worker_and_clone_has_a_block_of_ports_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = []
    for offset in range(0, 1000, 100):
        monkeypatch.setattr(workers, "clone_offset", lambda offset=offset: offset)
        for worker in ["", *(f"gw{n}" for n in range(workers.MAX_WORKERS))]:
            monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
            blocks.append(set(workers.port_block()))
    assert sum(len(block) for block in blocks) == len(set().union(*blocks))  # no port in two blocks
    assert max(max(block) for block in blocks) < 32768


def test_this_run_uses_its_own_share(db: Any) -> None:
    worker = workers.worker_id()
    assert settings.DATABASES["default"]["NAME"].endswith(f"_{worker}" if worker else "test_pilot_status")
    if worker:
        assert settings.CELERY_BROKER_URL.endswith(f"_{worker}")
        assert processes.LOG_DIR.name == worker
    assert settings.REDIS_URL.endswith(f"/{workers.FIRST_WORKER_REDIS_DB + workers.worker_index()}" if worker else "/1")


def test_a_port_handed_out_is_in_the_block_and_free_and_a_taken_one_is_passed_over() -> None:
    block = workers.port_block()
    first = processes.free_port()
    assert first in block
    with socket.socket() as taken:
        following = block.start + (first - block.start + 1) % len(block)
        taken.bind(("127.0.0.1", following))
        taken.listen()
        assert processes.free_port() not in (first, following)
