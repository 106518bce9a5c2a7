"""A threads-pool lane worker shares a few pooled connections among hundreds of threads (issue 26).
When none is free in time, the claim never reached Postgres: the task goes back to its queue for
another try in a moment, and the message is untouched (before, the task failed and the message
waited for the reconciler's lost-release pass: a minute, ten for marketing; bench B8 under load
logged 816 such failures in one run). Real psycopg pool, really exhausted."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery.exceptions import Retry
from django.db import connections
from django.db.backends.postgresql.base import DatabaseWrapper

from messaging.models import Message
from messaging.sending import lease, tasks, worker
from tests.messaging.sending_helpers import send


@contextmanager
def one_connection_pool() -> Iterator[Any]:
    """This thread's default connection is a pool of one connection, with a 0.2 s wait for it (yielded)."""
    ordinary = connections["default"]
    settings_dict = dict(ordinary.settings_dict)
    settings_dict["CONN_MAX_AGE"] = 0
    settings_dict["OPTIONS"] = {**settings_dict["OPTIONS"], "pool": {"min_size": 1, "max_size": 1, "timeout": 0.2}}
    pooled: Any = DatabaseWrapper(settings_dict, alias="default")
    pooled.pool.open(wait=True)
    connections["default"] = pooled
    try:
        yield pooled
    finally:
        connections["default"] = ordinary
        pooled.close()
        pooled.close_pool()


@contextmanager
def exhausted_pool() -> Iterator[None]:
    """This thread's default connection is a one-connection pool whose connection someone else holds."""
    with one_connection_pool() as pooled:
        held = pooled.pool.getconn()
        try:
            yield
        finally:
            pooled.pool.putconn(held)


def test_a_claim_without_a_free_connection_says_so(db):
    with exhausted_pool(), pytest.raises(worker.NoConnectionToClaim):
        worker.claim("00000000-0000-0000-0000-000000000000")


def test_the_task_goes_back_to_its_queue_and_the_message_is_untouched(alice, alice_instance):
    message = send(alice)
    before = Message.objects.values().get(pk=message.pk)
    with exhausted_pool(), pytest.raises(Retry):
        tasks.send_message(str(message.pk))
    assert Message.objects.values().get(pk=message.pk) == before
    assert before["status"] == "QUEUED"


def test_the_task_goes_back_to_its_queue_however_many_times_it_already_did(alice, alice_instance, empty_lanes):
    # Celery reads retry(max_retries=None) as "the task's default", three: the fourth time a claim found no free
    # connection, the task failed (MaxRetriesExceededError) and its message waited for the reconciler's lost-release
    # pass (a minute, ten for marketing). Bench B2 with another tenant's OTPs alongside logged 114 such failures in
    # one minute and did not see its 2,000 messages SENT within five. The message's deliverUntil bounds the tries.
    from pilot_status.celery import app

    message = send(alice)
    task = tasks.send_message
    # As the lane worker runs its tenth try of the task (not called directly: retry() publishes the next one).
    task.push_request(id="retried-task", args=[str(message.pk)], kwargs={}, retries=10, called_directly=False,
                      is_eager=False, delivery_info={"exchange": "", "routing_key": message.lane})
    try:
        with exhausted_pool(), pytest.raises(Retry):
            task.run(str(message.pk))
    finally:
        task.pop_request()
    with app.connection_for_write() as conn:
        published = conn.default_channel.basic_get(message.lane, no_ack=True)
    assert published is not None and published.headers["retries"] == 11
    assert published.headers["argsrepr"] == repr((str(message.pk),))
    assert Message.objects.get(pk=message.pk).status == "QUEUED"


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_meets_a_held_row_past_the_lock_timeout_goes_back_to_its_queue(alice, alice_instance):
    # given: another transaction holds the message's row (a connection.update releasing the instance's waiting
    # messages did, in a full run), and the worker's connection gives up on a lock after 200 ms as
    # DATABASE_LOCK_TIMEOUT_MS makes it (the test stack's 300 ms)
    import psycopg

    message = send(alice)
    before = Message.objects.values().get(pk=message.pk)
    settings_dict = connections["default"].settings_dict
    with psycopg.connect(host=settings_dict["HOST"], port=settings_dict["PORT"], dbname=settings_dict["NAME"],
                         user=settings_dict["USER"], password=settings_dict["PASSWORD"]) as holder:
        holder.execute("SELECT 1 FROM messaging_message WHERE id = %s FOR UPDATE", [message.pk])
        with connections["default"].cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        try:
            # when: the lane task claims it; then: it goes back to its queue for another try (before, it failed
            # and the message waited for the reconciler's lost-release pass: a minute, ten for marketing)
            with pytest.raises(Retry):
                tasks.send_message(str(message.pk))
        finally:
            with connections["default"].cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        holder.rollback()
    assert Message.objects.values().get(pk=message.pk) == before


@pytest.mark.django_db(transaction=True)
def test_an_answer_in_hand_waits_for_a_free_connection_to_be_recorded(simulator, alice, alice_instance, monkeypatch):
    # given: the lane worker's pool (one connection, a 0.2 s wait) is emptied by another thread while this send
    # waits on Evolution, and only given back a second later (a host short of CPU: bench B8 beside background work
    # of one low weight logged 2,787 such tasks in three runs, each after its sendText had gone out)
    import threading

    from tests.messaging.sending_helpers import open_on_simulator, sends_ok

    open_on_simulator(simulator, alice_instance)
    message = send(alice)
    given_back = threading.Event()
    release = worker.release_while_waiting
    with one_connection_pool() as pooled:
        def release_and_lose_the_connection() -> None:
            release()
            held = pooled.pool.getconn()
            threading.Timer(1.0, lambda: (pooled.pool.putconn(held), given_back.set())).start()

        monkeypatch.setattr(worker, "release_while_waiting", release_and_lose_the_connection)
        try:
            # when: the send's answer comes back with no connection free for 1 s
            outcome = tasks.send_message(str(message.pk))
        finally:
            given_back.wait(5)
    # then: the answer is recorded once a connection is free, instead of the task failing with the send
    # made and the message left SENDING until its lease ran out and Evolution was asked about it
    assert outcome == "sent"
    message.refresh_from_db()
    assert message.status == "SENT" and len(sends_ok(simulator, alice_instance.name)) == 1


def losing_the_connection_at(monkeypatch: Any, module: Any, name: str, pooled: Any, back_after: float | None) -> Any:
    """`module.name`, the first time it is called, first gives this thread's connection back and sees another thread
    take the pool's only one (back after `back_after` seconds; None: at the test's end), so its own statement meets a
    PoolTimeout (a loaded host)."""
    import threading

    from pilot_status.database import release_while_waiting

    real = getattr(module, name)
    held: list[Any] = []
    calls: list[int] = []

    def losing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            return real(*args, **kwargs)
        release_while_waiting()
        held.append(pooled.pool.getconn())
        if back_after is not None:
            threading.Timer(back_after, lambda: pooled.pool.putconn(held.pop())).start()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, losing)
    return held


def reserved_unofficial_number(alice: Any, simulator: Any) -> tuple[Any, Message]:
    """An open unofficial number the relay reserved for a queued message (as messaging.sending.human_pace does)."""
    from datetime import timedelta

    from django.utils import timezone

    from messaging.models import SendSchedule
    from tests.conftest import add_instance
    from tests.messaging.sending_helpers import open_on_simulator

    number = add_instance(alice.project, "alice-phone", priority=10, profile="unofficial")
    open_on_simulator(simulator, number)
    message = send(alice)
    SendSchedule.objects.create(instance=number, reserved_by=message.pk,
                                reserved_until=timezone.now() + timedelta(minutes=1))
    return number, message


def send_losing_the_connection_at(monkeypatch: Any, simulator: Any, alice: Any, name: str) -> tuple[Any, Message, str]:
    """The lane task for a message its unofficial number is reserved for, on a lane worker's pool (one connection, a
    0.2 s wait) that another thread empties for 1 s just as `slots.<name>` runs: (number, message, task result)."""
    import time

    from messaging.sending import slots

    number, message = reserved_unofficial_number(alice, simulator)
    with one_connection_pool() as pooled:
        held = losing_the_connection_at(monkeypatch, slots, name, pooled, back_after=1.0)
        try:
            outcome = tasks.send_message(str(message.pk))
        finally:
            while held:  # the other thread's connection back to this pool, whatever happened
                time.sleep(0.05)
    return number, message, outcome


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_meets_no_free_connection_before_the_call_is_given_back_at_once(simulator, alice, monkeypatch):
    # given: an unofficial number reserved for the message, and a lane worker's pool (one connection, a 0.2 s wait)
    # that another thread empties for 1 s just as the claim takes the number's turn (turns.take → slots.begin; a
    # bench run on a loaded host failed 883 tasks there, after their claim and before any call)
    from django.utils import timezone

    from messaging.models import OutboxEntry, SendSchedule
    from tests.messaging.sending_helpers import events, sends_ok

    # when: the lane task runs
    number, message, outcome = send_losing_the_connection_at(monkeypatch, simulator, alice, "begin")
    # then: the task ends normally, and nothing having been sent, the claim is given back at once instead of the
    # message staying SENDING, and its number reserved, until the lease runs out
    assert outcome == worker.GIVEN_BACK
    message.refresh_from_db()
    assert (message.status, message.attempts, message.lease_token) == ("QUEUED", 0, None)
    assert message.next_attempt_at <= timezone.now()
    assert OutboxEntry.objects.filter(message=message).exists()  # the relay releases it again
    assert events(message, "WAITING")[-1]["why"] == worker.NO_CONNECTION
    assert SendSchedule.objects.get(instance=number).reserved_by is None
    assert sends_ok(simulator, number.name) == []


@pytest.mark.django_db(transaction=True)
def test_a_claim_whose_lease_runs_out_waiting_for_a_connection_is_left_to_the_lease_expiry(
    simulator, alice, monkeypatch
):
    # given: as above, but no connection comes free before the claim's lease (1 s here) runs out
    from django.db import OperationalError

    from messaging.sending import slots

    _, message = reserved_unofficial_number(alice, simulator)
    monkeypatch.setattr(lease, "lease_seconds", lambda: 1.0)
    with one_connection_pool() as pooled:
        held = losing_the_connection_at(monkeypatch, slots, "begin", pooled, back_after=None)
        try:
            # when: the lane task runs; then: it fails as before, since giving the claim back needs a connection
            with pytest.raises(OperationalError):
                tasks.send_message(str(message.pk))
        finally:
            pooled.pool.putconn(held.pop())
    # and the message is the reconciler's lease expiry's, as after a crash
    message.refresh_from_db()
    assert message.status == "SENDING" and message.attempts == 0


@pytest.mark.django_db(transaction=True)
def test_a_send_whose_turn_ends_without_a_free_connection_is_recorded_once_one_is_free(simulator, alice, monkeypatch):
    # given: an unofficial number reserved for the message, and a lane worker's pool (one connection, a 0.2 s wait)
    # that another thread empties for 1 s just as the send's call is over and its number's turn ends (turns.end →
    # slots.finish: the first statement after the connection was given back for the call)
    from messaging.models import SendSchedule
    from tests.messaging.sending_helpers import sends_ok

    # when: the lane task runs
    number, message, outcome = send_losing_the_connection_at(monkeypatch, simulator, alice, "finish")
    # then: the send went out once and its answer is recorded, the number's send counted and the number free,
    # instead of the task failing with the send made, the message SENDING and the number reserved until the lease ran out
    assert outcome == "sent"
    message.refresh_from_db()
    assert message.status == "SENT" and len(sends_ok(simulator, number.name)) == 1
    schedule = SendSchedule.objects.get(instance=number)
    assert schedule.reserved_by is None and schedule.day_sent == 1
