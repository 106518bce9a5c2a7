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
from messaging.sending import tasks, worker
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
