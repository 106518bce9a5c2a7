"""Issue 22: a send's lease cannot run out while the send is under way."""

from __future__ import annotations

import threading
import time

from django.db import connection
from django.utils import timezone

from messaging import reconciler
from messaging.models import Message
from messaging.sending import worker
from tests.messaging.sending_helpers import make_due, open_on_simulator, send, sends_ok
from tests.pilot_status.test_settings import start_up


def test_a_lease_shorter_than_a_send_can_take_stops_start_up():
    result = start_up(SEND_LEASE_SECONDS="30", EVOLUTION_READ_TIMEOUT="40")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "SEND_LEASE_SECONDS=30" in result.stderr


def test_the_default_lease_grows_with_the_timeouts():
    from messaging.sending import budget

    result = start_up(EVOLUTION_READ_TIMEOUT="90", TYPING_DELAY_MAX_MS="20000")
    assert result.returncode == 0, result.stderr
    assert budget.lease_seconds_needed(3.0, 90.0, 20000) > 90 + 20


def test_a_claim_takes_a_lease_longer_than_its_worst_case(simulator, alice, alice_instance, settings):
    settings.SEND_LEASE_SECONDS = 5  # changed at run time: the claim still covers the worst case
    settings.TYPING_DELAY_MAX_MS = 70_000
    message = send(alice)
    claimed = worker.claim(str(message.pk))
    assert claimed is not None
    row = Message.objects.get(pk=message.pk)
    assert row.lease_expires_at is not None
    assert (row.lease_expires_at - timezone.now()).total_seconds() > settings.EVOLUTION_READ_TIMEOUT + 70


def test_a_slow_attempt_is_never_claimed_by_a_second_worker(transactional_db, simulator, alice, alice_instance, settings):
    # given: a slow gateway (every call takes 1.5 s) and a lease configured far too short
    settings.SEND_LEASE_SECONDS = 1
    settings.EVOLUTION_READ_TIMEOUT = 5.0
    open_on_simulator(simulator, alice_instance, latency_ms=1500)
    message = send(alice)
    results: list[str] = []

    def first_worker() -> None:
        try:
            results.append(worker.send_one(str(message.pk)))
        finally:
            connection.close()

    thread = threading.Thread(target=first_worker)
    thread.start()
    # when: while it is sending, the reconciler looks for expired leases and a second worker tries
    time.sleep(1.2)
    recovered = reconciler.recover_expired_leases()
    make_due(message)
    second = worker.send_one(str(message.pk))
    thread.join(30)

    # then: nobody took it from the first worker, and it was sent once
    assert recovered == 0 and second == worker.NOTHING_TO_CLAIM
    assert results == ["sent"]
    assert len(sends_ok(simulator, alice_instance.name)) == 1


def test_a_send_that_outlived_its_lease_is_recorded_not_lost(transactional_db, simulator, alice, alice_instance):
    # given: a slow send whose lease is taken away meanwhile (a stalled worker, a clock jump)
    open_on_simulator(simulator, alice_instance, latency_ms=1500)
    message = send(alice)
    results: list[str] = []

    def first_worker() -> None:
        try:
            results.append(worker.send_one(str(message.pk)))
        finally:
            connection.close()

    thread = threading.Thread(target=first_worker)
    thread.start()
    time.sleep(0.7)
    Message.objects.filter(pk=message.pk).update(lease_expires_at=timezone.now())
    assert reconciler.recover_expired_leases() == 1
    thread.join(30)

    # then: the compare-and-set saw the lease was gone, and the send it made is recorded all the same
    assert results == [worker.LEASE_LOST]
    row = Message.objects.get(pk=message.pk)
    sent = sends_ok(simulator, alice_instance.name)
    assert row.status == "SENT" and len(sent) == 1 and row.evolution_message_id == sent[0]["id"]
    assert row.outcome_unknown_since is None and row.unconfirmed_attempt_at is None
