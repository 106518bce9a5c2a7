"""GET /api/internal/status (issue 24): the operators' JSON page, behind its own credential, with every
process's heartbeat (stale ones flagged), the outbox per lane, the lane queues' depth and the circuits."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection, Producer

from messaging.sending import breaker
from pilot_status import heartbeats, metrics
from tests.messaging.sending_helpers import queue
from tests.support.services import stopped

TOKEN = "ops-status-token-for-the-tests-0123456789abcdef"


def secret() -> dict[str, str]:
    return {"HTTP_X_INTERNAL_WEBHOOK_SECRET": settings.INTERNAL_WEBHOOK_SECRET}


def page(client: Any, **headers: str) -> dict[str, Any]:
    response = client.get("/api/internal/status", **(headers or secret()))
    assert response.status_code == 200, response.content
    assert response["Cache-Control"] == "no-store"
    return response.json()


def marketing_queue(connection: Connection) -> Any:
    from pilot_status.celery import app

    [lane] = [queue for queue in app.conf.task_queues if queue.name == "marketing"]
    declared = lane(connection)
    declared.declare()
    return declared


@pytest.fixture
def purged_marketing() -> Iterator[None]:
    yield
    with Connection(settings.CELERY_BROKER_URL) as connection:
        marketing_queue(connection).purge()


def test_the_page_needs_its_token_or_the_internal_secret(db: Any, client: Any, settings: Any) -> None:
    settings.OPS_STATUS_TOKEN = TOKEN
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": TOKEN},
                    {"HTTP_X_INTERNAL_WEBHOOK_SECRET": "wrong"}):
        response = client.get("/api/internal/status", **headers)
        assert response.status_code == 401, headers
        assert response.json()["error"]["code"] == "unauthorized"
    assert client.get("/api/internal/status", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get("/api/internal/status", **secret()).status_code == 200
    settings.OPS_STATUS_TOKEN = ""  # unset: no bearer token opens it
    assert client.get("/api/internal/status", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_the_page_lists_heartbeats_and_flags_the_stale_ones(db: Any, client: Any) -> None:
    heartbeats.Process("relay:otp").beat(force=True)
    old = heartbeats.Process("consumer")
    old.beat(force=True)
    record = json.loads(metrics.redis().get(old.key))
    metrics.redis().set(old.key, json.dumps({**record, "at": time.time() - settings.HEARTBEAT_STALE_SECONDS - 5}))

    processes = page(client)["processes"]
    by_name = {beat["process"]: beat for beat in processes["list"]}
    assert by_name["relay:otp"]["stale"] is False and by_name["relay:otp"]["age_seconds"] < 5
    assert by_name["consumer"]["stale"] is True
    assert processes["stale"] == ["consumer"]
    # A heartbeat past its TTL is gone, and so is the process from the page.
    metrics.redis().delete(old.key)
    assert [beat["process"] for beat in page(client)["processes"]["list"]] == ["relay:otp"]


def test_the_page_shows_the_outbox_per_lane(transactional_db: Any, client: Any, alice: Any, alice_instance: Any) -> None:
    queue(alice, "UTILITY", 3)
    queue(alice, "OTP", 1)
    outbox = page(client)["outbox"]
    assert outbox["utility"]["depth"] == 3 and outbox["utility"]["due"] == 3
    assert outbox["otp"]["depth"] == 1
    assert outbox["marketing"] == {"depth": 0, "due": 0, "oldest_due_age_seconds": None, "oldest_age_seconds": None}
    assert 0 <= outbox["utility"]["oldest_due_age_seconds"] < 60


def test_the_page_shows_the_lane_queues_depth(db: Any, client: Any, purged_marketing: None) -> None:
    with Connection(settings.CELERY_BROKER_URL) as connection:
        lane = marketing_queue(connection)
        lane.purge()
        producer = Producer(connection.channel(), exchange=lane.exchange)
        for _ in range(2):
            producer.publish({"not": "a task"}, routing_key="marketing")
    queues = page(client)["queues"]
    assert queues["marketing"]["ready"] == 2
    assert {"otp", "utility", "marketing", "maintenance", "sync", "bulk"} <= set(queues)


def test_the_page_shows_the_circuits(transactional_db: Any, client: Any, alice_instance: Any) -> None:
    store = breaker.RedisStore(metrics.redis())
    store.set_open(breaker.instance_scope(alice_instance.name), time.time() + 60)
    circuits = page(client)["circuits"]
    assert circuits["gateway"] == {"state": "closed"}
    assert circuits["instances"][alice_instance.name]["state"] == "open"
    assert circuits["closed"] == 0
    store.set_open(breaker.GATEWAY, time.time() - 1)  # its open period is over: the next call probes
    assert page(client)["circuits"]["gateway"]["state"] == "half_open"


@pytest.mark.serial
def test_with_redis_stopped_the_page_still_answers_and_says_what_it_cannot_read(db: Any, client: Any) -> None:
    with stopped("redis"):
        body = page(client)
    assert "error" in body["processes"] and "error" in body["circuits"]
    assert body["outbox"]["otp"]["depth"] == 0
    assert set(body["queues"]) >= {"otp", "utility", "marketing"}  # the broker was read
