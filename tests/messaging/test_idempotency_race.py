"""Two requests with one Idempotency-Key racing on a real multi-threaded server: one message."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import requests

from messaging import opt_ins
from messaging.models import IdempotencyRecord, Message, OutboxEntry

BODY = {"to": "+5511988887777", "category": "UTILITY", "text": "Order shipped"}


def test_racing_requests_with_one_key_create_one_message(transactional_db, live_server, alice, alice_instance):
    opt_ins.record(alice.project, BODY["to"], "form")
    headers = {"Authorization": f"Bearer {alice.live_key}", "Idempotency-Key": "race-1"}

    def send(_: int) -> requests.Response:
        return requests.post(f"{live_server.url}/v1/messages/send", json=BODY, headers=headers, timeout=30)

    with ThreadPoolExecutor(max_workers=12) as pool:
        responses = list(pool.map(send, range(24)))

    assert {r.status_code for r in responses} == {202}
    assert len({r.json()["id"] for r in responses}) == 1
    assert Message.objects.count() == 1
    assert OutboxEntry.objects.count() == 1
    assert IdempotencyRecord.objects.count() == 1


def test_racing_requests_with_one_key_and_different_bodies(transactional_db, live_server, alice, alice_instance):
    opt_ins.record(alice.project, BODY["to"], "form")
    headers = {"Authorization": f"Bearer {alice.live_key}", "Idempotency-Key": "race-2"}

    def send(i: int) -> requests.Response:
        body = dict(BODY, text=f"variant {i % 2}")
        return requests.post(f"{live_server.url}/v1/messages/send", json=body, headers=headers, timeout=30)

    with ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(send, range(16)))

    assert {r.status_code for r in responses} <= {202, 409}
    accepted = [r for r in responses if r.status_code == 202]
    assert len({r.json()["id"] for r in accepted}) == 1
    assert Message.objects.count() == 1
    conflicts = [r for r in responses if r.status_code == 409]
    assert conflicts and all(r.json()["error"]["code"] == "idempotency_conflict" for r in conflicts)
