"""Rate limit per API key: shared through Redis, degrading to per-process when Redis is down."""

from __future__ import annotations

import pytest

from messaging import opt_ins
from messaging.api import throttling
from messaging.models import Message
from tests.support.private_redis import PrivateRedis

URL = "/v1/messages/send"
BODY = {"to": "+5511988887777", "category": "UTILITY", "text": "hi"}


@pytest.fixture
def private_redis(settings):
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


@pytest.fixture
def limited(settings, alice, alice_instance):
    settings.RATE_LIMIT_PER_SECOND = 0.01  # no refill within the test
    settings.RATE_LIMIT_BURST = 3
    opt_ins.record(alice.project, BODY["to"], "form")


def test_the_bucket_lives_in_redis_and_is_shared(private_redis, limited, alice):
    # two clients with the same key stand for two web processes: they share one bucket
    first, second = alice.client(), alice.client()
    assert [first.post(URL, BODY, format="json").status_code for _ in range(2)] == [202, 202]
    assert second.post(URL, BODY, format="json").status_code == 202
    assert second.post(URL, BODY, format="json").status_code == 429
    assert first.post(URL, BODY, format="json").status_code == 429


def test_keys_have_separate_buckets(private_redis, limited, alice):
    live, test = alice.client(live=True), alice.client(live=False)
    for _ in range(3):
        live.post(URL, BODY, format="json")
    assert live.post(URL, BODY, format="json").status_code == 429
    opt_ins.record(alice.project, alice.project.test_number, "dev")
    assert test.post(URL, dict(BODY, to=alice.project.test_number), format="json").status_code == 202


def test_with_redis_down_sends_are_still_accepted_and_limited_per_process(private_redis, limited, alice):
    private_redis.stop()
    client = alice.client()
    statuses = [client.post(URL, BODY, format="json").status_code for _ in range(4)]
    assert statuses == [202, 202, 202, 429]
    assert Message.objects.count() == 3
