"""Hostile bodies on Evolution's RabbitMQ channel (issue 21): parked at once, the same bounds as the webhook."""

from __future__ import annotations

import amqp
import pytest

from ingestion.models import IngestionEvent
from tests.ingestion.test_consumer import connection, depth, exchange_name, run_once, topo  # noqa: F401

DEEP = b"[" * 5_000 + b"]" * 5_000


@pytest.mark.parametrize(
    "body",
    [
        DEEP,  # a RecursionError before: three retries (5 s, 30 s, 3 min) before it was parked
        b'{"event": "messages.update", "instance": "alice-main", "data": ' + DEEP + b"}",
        b'{"event": "messages.update", "instance": "alice-main", "data": {"n": 1' + b"0" * 100 + b"}}",
        b'{"event": "messages.update", "instance": "alice-main\\u0000", "data": {}}',
        b'{"event": "messages.update", "instance": "' + b"x" * 60_000 + b'", "data": {}}',
        b'{"event": "messages.update", "instance": "alice-main", "data": {"t": "\xe2\x82"}}',
    ],
)
def test_a_hostile_body_is_parked_at_once_and_stores_nothing(transactional_db, connection, topo, exchange_name, body):
    connection.default_channel.basic_publish(amqp.Message(body), exchange=exchange_name, routing_key="messages.update")

    run_once(connection, topo)

    assert depth(connection, topo.parking) == 1
    assert all(depth(connection, queue) == 0 for queue in topo.retries)
    assert IngestionEvent.objects.count() == 0
