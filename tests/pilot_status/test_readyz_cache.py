"""/readyz answers from a check made at most READINESS_CACHE_SECONDS ago (issue 45 §6): it is unauthenticated,
so a flood of probes must not open a connection to Postgres, Redis and RabbitMQ each."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.test import RequestFactory

from pilot_status import health


@pytest.fixture
def counted(monkeypatch: Any, settings: Any) -> Counter:
    """The real checks, counted."""
    calls: Counter = Counter()

    def counting(name: str, check: Any) -> Any:
        def run() -> Any:
            calls[name] += 1
            return check()
        return run

    monkeypatch.setattr(health, "CHECKS", {name: counting(name, check) for name, check in health.CHECKS.items()})
    health.forget()
    yield calls
    health.forget()


def probe() -> int:
    return health.readyz(RequestFactory().get("/readyz")).status_code


def test_a_flood_of_probes_costs_one_check_per_window(db: Any, counted: Counter, settings: Any) -> None:
    settings.READINESS_CACHE_SECONDS = 1.0
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: probe(), range(200)))
    assert answers == [200] * 200
    assert counted == Counter({"postgres": 1, "redis": 1, "broker": 1})

    time.sleep(1.1)  # the window has passed: the next probe checks again
    assert probe() == 200
    assert counted == Counter({"postgres": 2, "redis": 2, "broker": 2})


def test_a_failure_is_cached_as_briefly(db: Any, counted: Counter, settings: Any) -> None:
    settings.READINESS_CACHE_SECONDS = 1.0
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"  # nothing listens on port 1
    assert [probe() for _ in range(5)] == [503] * 5
    assert counted["broker"] == 1


def test_zero_checks_every_time(db: Any, counted: Counter, settings: Any) -> None:
    settings.READINESS_CACHE_SECONDS = 0
    assert [probe() for _ in range(3)] == [200] * 3
    assert counted["postgres"] == 3
