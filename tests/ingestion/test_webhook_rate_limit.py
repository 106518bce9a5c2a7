"""Per-instance webhook rate limit (issue 21): an authenticated instance over its rate is shed with 429 and
Retry-After (Evolution retries on non-2xx) before anything is stored; strangers still get 401; our own
forwards are never limited; shared through Redis, per process when Redis is down."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from ingestion.models import IngestionEvent
from tests.conftest import add_instance
from tests.ingestion.helpers import URL, counter, receipt, token_header


@pytest.fixture
def limited(settings):
    settings.WEBHOOK_RATE_PER_INSTANCE = 0.01  # no refill within the test
    settings.WEBHOOK_RATE_BURST = 3


def post(payload, **headers):
    return Client().post(URL, data=json.dumps(payload), content_type="application/json", **headers)


def statuses(instance, count, **extra):
    return [post(receipt("DELIVERY_ACK", key_id=f"K{n}", instance=instance.name), **token_header(instance), **extra)
            for n in range(count)]


def test_an_instance_over_its_rate_is_shed_with_429_and_retry_after(limited, alice_instance):
    answers = statuses(alice_instance, 5)

    assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
    refused = answers[3]
    assert refused.json()["error"]["code"] == "rate_limited"
    assert int(refused["Retry-After"]) >= 1
    assert IngestionEvent.objects.count() == 3  # the shed ones stored nothing
    assert counter("webhook:rate_limited") == 2


def test_instances_have_separate_buckets(limited, alice, alice_instance):
    other = add_instance(alice.project, "alice-second")
    statuses(alice_instance, 4)
    assert [a.status_code for a in statuses(other, 3)] == [200, 200, 200]


def test_strangers_are_told_401_not_429(limited, alice_instance):
    statuses(alice_instance, 4)  # alice's bucket is empty
    stranger = post(receipt("DELIVERY_ACK"), HTTP_X_WEBHOOK_TOKEN="wrong")
    assert stranger.status_code == 401
    unknown = post(receipt("DELIVERY_ACK", instance="nobody"), **token_header(alice_instance))
    assert unknown.status_code == 401


def test_our_own_forwards_are_not_limited(limited, settings, alice_instance):
    statuses(alice_instance, 4)
    secret = {"HTTP_X_INTERNAL_WEBHOOK_SECRET": settings.INTERNAL_WEBHOOK_SECRET}
    for n in range(5):
        forwarded = dict(receipt("READ", key_id=f"F{n}"), already_saved=True)
        assert post(forwarded, **secret).status_code == 200


def test_the_default_is_far_above_what_the_bench_pushes_through_one_instance(settings):
    # B5 pushed 380-600 unique receipts/s through one instance (bench/findings.md), B2 spreads its
    # receipts over a fleet; the limit is for a runaway or hostile sender, not for load.
    assert settings.WEBHOOK_RATE_PER_INSTANCE >= 1_000
    assert settings.WEBHOOK_RATE_BURST >= 2_000


def test_the_bucket_is_shared_through_redis(private_redis, limited, alice_instance):
    # Two clients stand for two webhook processes: the shared bucket holds 3 in all.
    first = [post(receipt("SERVER_ACK", key_id=f"A{n}"), **token_header(alice_instance)).status_code for n in range(2)]
    second = [post(receipt("SERVER_ACK", key_id=f"B{n}"), **token_header(alice_instance)).status_code for n in range(2)]
    assert first + second == [200, 200, 200, 429]


def test_with_redis_down_the_limit_holds_per_process(private_redis, limited, alice_instance):
    private_redis.stop()
    assert [a.status_code for a in statuses(alice_instance, 4)] == [200, 200, 200, 429]
