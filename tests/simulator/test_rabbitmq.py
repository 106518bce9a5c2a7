"""RabbitMQ publishing: bodies without destination, no AMQP properties, Evolution's exchanges.

Needs the broker at SIMULATOR_TEST_RABBITMQ_URL (started by `make test`): these tests fail,
not skip, when it is absent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage

from .conftest import Json, EXCHANGE, RABBITMQ_URL, Simulator, sample, shape, wait_for

BODY_KEYS = ["event", "instance", "data", "date_time", "sender", "server_url", "apikey"]


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """asyncio.run on a thread of its own: the browser tests' Playwright (a session fixture) can leave an
    event loop marked running on the main thread, where asyncio.run refuses to start."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _wait_connected(sim: Simulator) -> None:
    wait_for(lambda: sim.stats()["rabbitmq"]["connected"], timeout=15,
             message=f"the simulator to connect to RabbitMQ at {RABBITMQ_URL}")


async def _collect(exchange: str, count: int, trigger: Any) -> list[DeliveredMessage]:
    """Bind our own exclusive queue to `exchange` with '#', run `trigger`, collect `count` messages."""
    connection = await aiormq.connect(RABBITMQ_URL)
    try:
        channel = await connection.channel()
        await channel.exchange_declare(exchange=exchange, exchange_type="topic", durable=True)
        queue = (await channel.queue_declare(exclusive=True, auto_delete=True)).queue
        assert queue is not None
        await channel.queue_bind(queue, exchange, routing_key="#")
        received: list[DeliveredMessage] = []
        done = asyncio.Event()

        async def on_message(message: DeliveredMessage) -> None:
            received.append(message)
            if len(received) >= count:
                done.set()

        await channel.basic_consume(queue, on_message, no_ack=True)
        await asyncio.to_thread(trigger)
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.1)  # catch any unexpected extra message
        return received
    finally:
        await connection.close()


async def _cleanup(queues: list[str], exchanges: list[str]) -> dict[str, Any]:
    """Check Evolution's queues exist as quorum queues, then delete them and the exchanges."""
    connection = await aiormq.connect(RABBITMQ_URL)
    try:
        channel = await connection.channel()
        found = {}
        for name in queues:
            # Re-declaring with the same arguments only succeeds if they match (else 406).
            ok = await channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
            found[name] = ok.message_count
            await channel.queue_delete(name)
        for name in exchanges:
            await channel.exchange_delete(name)
        return found
    finally:
        await connection.close()


def test_global_mode_publishes_like_evolution(sim: Simulator, inst: Json) -> None:
    sim.control("global", {"rabbitmq_global": True, "exchange": EXCHANGE, "prefix": EXCHANGE})
    _wait_connected(sim)
    sent: dict[str, Any] = {}

    def trigger() -> None:
        sent.update(sim.send_text("my-instance").json())

    messages = run(_collect(EXCHANGE, 4, trigger))
    assert [m.routing_key for m in messages] == ["send.message"] + ["messages.update"] * 3
    bodies = [json.loads(m.body) for m in messages]
    assert [list(b) for b in bodies] == [BODY_KEYS] * 4  # no destination
    assert shape(bodies[0]) == shape(sample("rabbitmq.send.message.body.json"))
    assert bodies[0]["data"] == sent
    assert shape(bodies[3]) == shape(sample("rabbitmq.messages.update.body.json"))
    assert [b["data"]["status"] for b in bodies[1:]] == ["SERVER_ACK", "DELIVERY_ACK", "READ"]
    for message in messages:
        props = message.header.properties
        assert (props.content_type, props.delivery_mode, props.headers, props.message_id) == (None, None, None, None)
    assert sim.stats()["rabbitmq"]["published"] == 4
    queues = run(_cleanup([f"{EXCHANGE}.send.message", f"{EXCHANGE}.messages.update"], [EXCHANGE]))
    assert queues == {f"{EXCHANGE}.send.message": 1, f"{EXCHANGE}.messages.update": 3}


def test_instance_mode_publishes_on_an_exchange_named_after_it(sim: Simulator) -> None:
    name = f"{EXCHANGE}-inst"
    sim.instance(name, rabbitmq={"enabled": True, "events": ["SEND_MESSAGE"]})
    _wait_connected(sim)
    messages = run(_collect(name, 1, lambda: sim.send_text(name)))
    assert len(messages) == 1 and messages[0].routing_key == "send.message"
    assert json.loads(messages[0].body)["instance"] == name
    run(_cleanup([f"{name}.send.message"], [name]))


async def _queue_exists(name: str) -> bool:
    connection = await aiormq.connect(RABBITMQ_URL)
    try:
        channel = await connection.channel()
        await channel.queue_declare(name, passive=True)
        return True
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    finally:
        await connection.close()


def test_duplicate_and_drop_rates_without_queue_declaration(sim: Simulator) -> None:
    name = f"{EXCHANGE}-dup"
    sim.control("global", {"declare_queues": False})
    sim.instance(name, rabbitmq={"enabled": True, "events": ["SEND_MESSAGE"]},
                 faults={"rabbitmq_duplicate_rate": 1})
    _wait_connected(sim)
    messages = run(_collect(name, 2, lambda: sim.send_text(name)))
    assert [m.routing_key for m in messages] == ["send.message"] * 2 and messages[0].body == messages[1].body
    sim.instance(name, faults={"rabbitmq_duplicate_rate": 0, "rabbitmq_drop_rate": 1})
    sim.send_text(name)
    stats = wait_for(lambda: (s := sim.stats()["rabbitmq"])["dropped"] == 1 and s)
    assert (stats["published"], stats["duplicated"]) == (2, 1)
    assert not run(_queue_exists(f"{name}.send.message"))
    run(_cleanup([], [name]))
