"""The per-process instance caches stay within a fixed bound whatever unauthenticated callers send
(issue 21: 3,000 webhooks with 60 KB junk instance names grew two workers by 185 MB)."""

from __future__ import annotations

import gc
import json
import tracemalloc

from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext

from ingestion import auth
from tests.ingestion.helpers import URL, receipt, token_header


def junk(name: str, envelope: bool = True) -> bytes:
    payload = receipt("DELIVERY_ACK", instance=name)
    payload["apikey"] = "wrong"
    if not envelope:
        del payload["data"]
    return json.dumps(payload).encode()


def test_junk_names_longer_than_an_instance_name_cost_no_read_and_no_memory(alice_instance):
    client = Client()
    bodies = [junk(f"{n:06d}" + "x" * 60_000) for n in range(5)]
    for body in bodies:  # warm-up: whatever the first requests allocate for good
        client.post(URL, data=body, content_type="application/json")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with CaptureQueriesContext(connection) as queries:
            for n in range(300):
                body = junk(f"{n:06d}" + "x" * 60_000)
                response = client.post(URL, data=body, content_type="application/json")
                assert response.status_code == 401
                del body, response
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()

    assert queries.captured_queries == []  # refused before any lookup
    assert auth.cache_footprint() == (0, 0)
    assert grown < 2 * 1024 * 1024, f"grew {grown / 1e6:.1f} MB over 300 junk webhooks"


def test_the_unknown_names_cache_is_bounded_by_count_and_bytes(db, monkeypatch):
    monkeypatch.setattr(auth, "UNKNOWN_MAX_ENTRIES", 50)
    monkeypatch.setattr(auth, "UNKNOWN_MAX_BYTES", 4_000)
    client = Client()
    for n in range(200):  # valid-looking names, each unknown: remembered, within the bounds
        name = f"junk-{n:04d}-" + "y" * (80 if n % 2 else 5)
        assert client.post(URL, data=junk(name), content_type="application/json").status_code == 401
        entries, size = auth.cache_footprint()
        assert entries <= 50 and size <= 4_000

    entries, size = auth.cache_footprint()
    assert 0 < entries <= 50 and 0 < size <= 4_000


def test_the_most_recent_unknown_names_are_the_ones_kept(db, monkeypatch):
    monkeypatch.setattr(auth, "UNKNOWN_MAX_ENTRIES", 10)
    client = Client()
    for n in range(30):
        client.post(URL, data=junk(f"junk-{n}"), content_type="application/json")
    with CaptureQueriesContext(connection) as queries:
        client.post(URL, data=junk("junk-29"), content_type="application/json")  # still remembered
    assert queries.captured_queries == []
    with CaptureQueriesContext(connection) as queries:
        client.post(URL, data=junk("junk-0"), content_type="application/json")  # evicted long ago
    assert len(queries.captured_queries) == 1


def test_a_body_that_is_not_an_event_caches_nothing(db):
    client = Client()
    for n in range(20):
        assert client.post(URL, data=junk(f"no-envelope-{n}", envelope=False),
                           content_type="application/json").status_code == 401
    assert auth.cache_footprint() == (0, 0)


def test_a_real_instance_is_still_cached_and_answers_without_a_read(alice_instance):
    client = Client()
    body = json.dumps(receipt("SERVER_ACK", key_id="NOT-SENT-BY-US")).encode()
    assert client.post(URL, data=body, content_type="application/json", **token_header(alice_instance)).status_code == 200
    assert auth.cache_footprint()[0] == 1
    with CaptureQueriesContext(connection) as queries:
        request = RequestFactory().post(URL)
        assert auth.authenticate_evolution(request, {"instance": "alice-main", "apikey": "TOKEN-ALICE-MAIN"}) is not None
    assert queries.captured_queries == []


def test_the_known_instances_cache_is_bounded_too(alice, monkeypatch):
    from tests.conftest import add_instance

    monkeypatch.setattr(auth, "KNOWN_MAX_ENTRIES", 3)
    client = Client()
    for n in range(8):
        instance = add_instance(alice.project, f"fleet-{n}")
        body = json.dumps(receipt("SERVER_ACK", instance=instance.name, key_id="NOT-SENT")).encode()
        assert client.post(URL, data=body, content_type="application/json", **token_header(instance)).status_code == 200
    assert auth.cache_footprint()[0] <= 3
