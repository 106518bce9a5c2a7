"""Row locks taken while applying an event or resolving a dead letter never hold up an accept.

Every accept inserts rows that reference the project, the API key and the instance; Postgres
checks those foreign keys with FOR KEY SHARE. A FOR UPDATE on one of those rows (a plain
select_for_update, or one that also locks the rows it joins) makes every send of the project or
instance wait for that transaction, and fail with the stack's lock timeout. FOR NO KEY UPDATE
serialises what needs serialising without that."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connection, transaction

from ingestion import handlers
from messaging import lifecycle, resend
from messaging.models import DeadLetter, FailureReason, Status
from tests.ingestion.helpers import make_message, sample
from tests.messaging.sending_helpers import send


@contextmanager
def held_in_another_transaction(hold: Callable[[threading.Event, threading.Event], None]) -> Iterator[None]:
    locked, release = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            hold(locked, release)
        except BaseException as exc:  # reported by the test
            failure.append(exc)
            locked.set()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert locked.wait(10), "the other transaction never took its lock"
        assert not failure, failure
        yield
    finally:
        release.set()
        thread.join(10)
    assert not failure, failure


def accept_with_lock_timeout(actor) -> None:
    with connection.cursor() as cursor:  # as the stack runs it (DATABASE_LOCK_TIMEOUT_MS)
        cursor.execute("SET lock_timeout = '300ms'")
    try:
        message = send(actor)  # asserts 202
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert message.status == Status.QUEUED


def test_an_accept_goes_through_while_a_connection_update_is_being_applied(
    transactional_db, alice, alice_instance, monkeypatch
):
    real_sync = handlers.instance_state.sync

    def hold(locked: threading.Event, release: threading.Event) -> None:
        def slow_sync(instance, state):  # the instance row is locked by now
            locked.set()
            release.wait(10)
            return real_sync(instance, state)

        monkeypatch.setattr(handlers.instance_state, "sync", slow_sync)
        payload = sample("webhook.connection.update.open.json", alice_instance.name, state="open")
        handlers.ingest("WEBHOOK", payload)

    with held_in_another_transaction(hold):
        accept_with_lock_timeout(alice)


def test_an_accept_goes_through_while_a_dead_letter_is_being_resolved(transactional_db, alice, alice_instance):
    failed = make_message(alice.project, alice_instance, status=Status.SENDING)
    assert lifecycle.fail(failed, FailureReason.REJECTED, "test", from_statuses=(Status.SENDING,))
    dead_letter = DeadLetter.objects.get(message=failed)

    def hold(locked: threading.Event, release: threading.Event) -> None:
        with transaction.atomic():
            resend._lock(dead_letter)
            locked.set()
            release.wait(10)

    with held_in_another_transaction(hold):
        accept_with_lock_timeout(alice)
