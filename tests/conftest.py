"""Named actors and the real services for the whole suite.

Actors (hc `BaseTestCase` style):
- alice: owns a production-approved project with TEST and LIVE keys and her own instance.
- bob: a dashboard member of alice's project.
- carol: another tenant; everything of alice's must answer 404 to her.

Services are real: Postgres, Redis and RabbitMQ started by `make test` (scripts/services.sh),
the Evolution simulator started here as a subprocess, and, for `stack` tests, gunicorn, the relay
and one Celery worker per lane as subprocesses against the test database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from messaging import operators
from messaging.models import Instance, Project
from tests.support.private_redis import PrivateRedis
from tests.support.processes import Stack, start_simulator
from tests.support.simulator import SimulatorClient


@dataclass
class Actor:
    project: Project
    test_key: str
    live_key: str

    def client(self, live: bool = True) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.live_key if live else self.test_key}")
        return client


def make_actor(name: str, number: str, approved: bool = True) -> Actor:
    created = operators.create_project(name, number, production_approved=approved)
    project = Project.objects.get(pk=created["project_id"])
    return Actor(project, created["test_api_key"], created["live_api_key"])


@pytest.fixture
def alice(db: Any) -> Actor:
    # Project owner: approved for production, test number +5511999990001.
    return make_actor("Alice Store", "+5511999990001")


@pytest.fixture
def carol(db: Any) -> Actor:
    # Another tenant: must never see alice's objects (404, not 403).
    return make_actor("Carol Bank", "+5511999990003")


@pytest.fixture
def bob(alice: Actor) -> Any:
    # A member of alice's project (dashboard user).
    from django.contrib.auth import get_user_model

    operators.create_member(alice.project.pk, "bob", "bob-password-123")
    return get_user_model().objects.get(username="bob")


@pytest.fixture
def ops(db: Any) -> Any:
    # An operator signed in to the admin: a staff superuser, who sees every project.
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-123")
    client = Client()
    client.force_login(user)
    return client


def add_instance(project: Project | None, name: str, *, official: bool = False, priority: int = 100,
                 token: str | None = None, profile: str = "official") -> Instance:
    # `official` send profile unless a test says otherwise: the tests written before the sending policy measure
    # throughput, retries and routing, not a human pace (tests/messaging/test_sending_policy*.py do).
    operators.add_instance(name, project.pk if project else None, official=official, priority=priority,
                           token=token or f"TOKEN-{name}".upper(), profile=profile)
    if profile == "official":
        # Nor Meta's pair rate: they send many messages to one recipient to measure what the pipeline does.
        Instance.objects.filter(name=name).update(send_policy={"pair_gap_seconds": 0})
    return Instance.objects.get(name=name)


@pytest.fixture
def alice_instance(alice: Actor) -> Instance:
    return add_instance(alice.project, "alice-main", priority=10)


@pytest.fixture
def official_instance(db: Any) -> Instance:
    return add_instance(None, "pilot-official", official=True, priority=1)


# ---- real services -------------------------------------------------------------------------

@pytest.fixture(scope="session")
def simulator_process() -> Iterator[SimulatorClient]:
    sim = start_simulator()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def simulator(simulator_process: SimulatorClient, settings: Any) -> Iterator[SimulatorClient]:
    """The simulator, reset before each test, and this process's settings pointed at it."""
    simulator_process.reset()
    settings.EVOLUTION_API_URL = simulator_process.base_url
    yield simulator_process


@pytest.fixture(scope="session", autouse=True)
def _clean_database_at_start(django_db_setup: Any, django_db_blocker: Any) -> None:
    """--reuse-db keeps the test database between runs; rows a stack process wrote after the last
    flush of the previous run (a late receipt, a consumer redelivery) must not leak into this one."""
    from django.core.management import call_command

    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(scope="session")
def stack_process(django_db_setup: Any, django_db_blocker: Any, simulator_process: SimulatorClient) -> Iterator[Stack]:
    stack = Stack(simulator_process)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def stack(stack_process: Stack, transactional_db: Any, simulator: SimulatorClient) -> Iterator[Stack]:
    """Web, relay and lane workers running against the test database (data committed for real)."""
    stack_process.purge_queues()
    yield stack_process
    # Let in-flight work settle before the database is flushed: a TRUNCATE racing the relay's
    # or a worker's transaction can deadlock.
    stack_process.wait_until_quiet()


@pytest.fixture
def private_redis(settings: Any) -> Iterator[PrivateRedis]:
    """A Redis of the test's own, as the cache (the rate limiters' buckets), that it may stop."""
    from messaging.api import throttling

    redis = PrivateRedis().start()
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis.url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
        }
    }
    throttling._script = None
    yield redis
    redis.cleanup()
    throttling._script = None


@pytest.fixture(autouse=True)
def _clean_redis() -> None:
    from django_redis import get_redis_connection

    try:
        get_redis_connection("default").flushdb()
    except Exception:
        pass  # a test that stopped Redis restarts it in its own teardown


# tests/image runs only under `make image-check`, which builds the image and names it here: the suite itself
# never builds one (minutes of CPU, and a builder the machine may not have).
collect_ignore = [] if os.environ.get("PILOT_STATUS_IMAGE") else ["image"]


def pytest_configure(config: Any) -> None:
    os.environ.setdefault("PILOT_STATUS_TESTS", "1")
    # Tests read a counter right after the work it counts: this process sends each count at once.
    # The processes a stack test starts keep the default; tests/pilot_status/test_metrics_carry.py
    # covers the wait.
    settings.METRICS_FLUSH_SECONDS = 0
