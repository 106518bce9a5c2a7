"""No ingestion path waits on the network while its Postgres transaction is open.

A transaction left open across a Redis round trip, an HTTP call or a sleep holds its row locks (the new inbox row,
the instance row a connection.update locks) for as long as the other side takes, and shows in pg_stat_activity as
`idle in transaction`: other writers, VACUUM and a TRUNCATE queue behind it. Every such wait of the webhook's
paths is spied on here, with the state of this thread's connection at that moment (psycopg's transaction status).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.connection
import urllib3
from django.db import connection
from psycopg.pq import TransactionStatus

from ingestion import receive
from messaging.sending import instance_state
from tests.ingestion.helpers import make_message, receipt, sample


def _transaction_status() -> TransactionStatus:
    raw = connection.connection
    return TransactionStatus.IDLE if raw is None else raw.info.transaction_status


@pytest.fixture
def waits_in_transaction(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The waits (a Redis command, an HTTP request, a sleep) made while this thread's transaction was open."""
    seen: list[str] = []

    def spy(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def waiting(*args: Any, **kwargs: Any) -> Any:
            if connection.in_atomic_block or _transaction_status() != TransactionStatus.IDLE:
                seen.append(name)
            return real(*args, **kwargs)
        return waiting

    sender = redis.connection.AbstractConnection
    monkeypatch.setattr(sender, "send_packed_command", spy("redis", sender.send_packed_command))
    pool = urllib3.connectionpool.HTTPConnectionPool
    monkeypatch.setattr(pool, "urlopen", spy("http", pool.urlopen))
    monkeypatch.setattr(time, "sleep", spy("sleep", time.sleep))
    yield seen


def _inbound(text: str) -> dict[str, Any]:
    payload = sample("webhook.messages.upsert.inbound-text.json")
    payload["data"]["message"] = {"conversation": text}
    return payload


EVENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "receipt of a known message": lambda: receipt("DELIVERY_ACK"),
    "receipt before its send is known": lambda: receipt("READ", key_id="NOT-SENT-YET"),
    "error receipt": lambda: sample("webhook.messages.update.ERROR.json"),
    "send confirmation": lambda: sample("webhook.send.message.json"),
    "connection open": lambda: sample("webhook.connection.update.open.json"),
    "connection close": lambda: sample("webhook.connection.update.close.json"),
    "inbound text": lambda: _inbound("Sim, confirmo!"),
    "inbound opt-out keyword": lambda: _inbound("STOP"),
    "message deleted": lambda: sample("webhook.messages.delete.json"),
}


@pytest.mark.parametrize("event", list(EVENTS))
def test_no_wait_while_an_events_transaction_is_open(transactional_db, alice, alice_instance, waits_in_transaction,
                                                     event):
    make_message(alice.project, alice_instance)

    webhook = receive.receive_webhook(EVENTS[event]())
    # The consumer's copy (stamped later, so a snapshot event is a new one), forwarded after it stored it.
    forwarded = receive.receive_forwarded({**EVENTS[event](), "date_time": "2099-01-01T00:00:00.001Z"})

    assert webhook.status == receive.PROCESSED and forwarded.status in (receive.PROCESSED, receive.SKIPPED)
    assert waits_in_transaction == []
    assert _transaction_status() == TransactionStatus.IDLE  # nothing left open for the thread's next request


def test_a_connection_update_still_refreshes_the_workers_cached_view_once_committed(transactional_db, alice_instance):
    instance_state.remember(alice_instance.name, "open")

    assert receive.receive_webhook(sample("webhook.connection.update.close.json")).reason == "state_changed"

    cached = instance_state._cached(alice_instance.name)
    assert cached is not None and cached[0] == "close"
