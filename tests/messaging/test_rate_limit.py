"""Rate limit per API key: shared through Redis, degrading to per-process when Redis is down."""

from __future__ import annotations

import time

import pytest

from messaging import opt_ins
from messaging.api import throttling
from messaging.models import Message

URL = "/v1/messages/send"
BODY = {"to": "+5511988887777", "category": "UTILITY", "text": "hi"}


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
    opt_ins.record(alice.project, alice.project.test_number, "dev", environment="TEST")
    assert test.post(URL, dict(BODY, to=alice.project.test_number), format="json").status_code == 202


def test_with_redis_down_sends_are_still_accepted_and_limited_per_process(private_redis, limited, alice):
    private_redis.stop()
    client = alice.client()
    statuses = [client.post(URL, BODY, format="json").status_code for _ in range(4)]
    assert statuses == [202, 202, 202, 429]
    assert Message.objects.count() == 3


# ---- leases: a busy key takes its tokens a few at a time ----------------------------------

@pytest.fixture
def script_calls(monkeypatch):
    calls = []
    throttling._script = None
    throttling.take_token("warm-up", 1, 1)  # registers the script
    real = throttling._script

    def counted(*args, **kwargs):
        calls.append(kwargs.get("args"))
        return real(*args, **kwargs)

    monkeypatch.setattr(throttling, "_script", counted)
    monkeypatch.setattr(throttling, "_leases", throttling._Leases())
    return calls


def fresh_key() -> str:
    import uuid

    return f"test:{uuid.uuid4().hex}"


def test_a_busy_key_takes_its_tokens_a_few_at_a_time(script_calls):
    key = fresh_key()
    assert throttling.lease_size(400, 100) == 20
    assert [throttling.take_token(key, 400, 100)[0] for _ in range(20)] == [True] * 20
    assert len(script_calls) == 1 and script_calls[0][-1] == 20
    assert throttling.take_token(key, 400, 100)[0]
    assert len(script_calls) == 2


def test_a_key_at_the_default_limit_takes_two_and_a_slow_key_one():
    assert throttling.lease_size(50, 100) == 2
    assert throttling.lease_size(1, 3) == 1
    assert throttling.lease_size(10_000, 5) == 5  # never more than the burst


def test_tokens_left_in_a_lease_are_dropped_not_saved_up(script_calls, monkeypatch):
    monkeypatch.setattr(throttling, "LEASE_SECONDS", 0.01)
    key = fresh_key()
    throttling.take_token(key, 4000, 100)  # takes 20... (lease_size with 0.01 s: 40 → capped 20)
    time.sleep(0.03)
    throttling.take_token(key, 4000, 100)
    assert len(script_calls) == 2  # the 19 left had expired


def test_leases_never_let_the_shared_limit_be_exceeded(monkeypatch):
    """Two processes (two lease holders) on one bucket: what both allow stays within burst + rate × time."""
    key = fresh_key()
    rate, burst = 400.0, 20
    holders = [throttling._Leases(), throttling._Leases()]
    allowed = 0
    started = time.monotonic()
    for i in range(400):
        monkeypatch.setattr(throttling, "_leases", holders[i % 2])
        allowed += throttling.take_token(key, rate, burst)[0]
    elapsed = time.monotonic() - started
    assert allowed <= burst + rate * elapsed + 1
    assert allowed >= burst  # and the burst itself is all there
