"""RabbitMQ publishing like Evolution's rabbitmq.controller.ts.

- Topic exchanges, durable; routing key = dotted event name.
- Messages carry NO properties (no content_type, delivery_mode, headers or message id):
  amqplib's ``channel.publish`` is called without options. aiormq's ``basic_publish``
  would add ``delivery_mode=1`` and a random ``message_id``, so frames are written directly.
- Optionally asserts Evolution's quorum queues ``<prefix>.<event>`` / ``<instance>.<event>``.
- While the broker is unreachable events are dropped with a warning (no buffering) and a
  background task reconnects; the HTTP side never waits on the broker.

One connection, one channel, one publishing task: events leave in the order they were emitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from pamqp import commands as spec
from pamqp.header import ContentHeader

from .state import World

log = logging.getLogger("simulator.rabbitmq")

# (exchange, routing_key, body, queue_to_assert or None)
Item = tuple[str, str, bytes, str | None]

_QUEUE_LIMIT = 100_000  # bounded hand-off to the publishing task
_DRAIN_EVERY = 64  # wait for the socket write every N messages: bounds aiormq's write queue


class RabbitPublisher:
    def __init__(self, world: World, url: str) -> None:
        self.world = world
        self.url = url
        self.connected = False
        self._queue: asyncio.Queue[Item | None] = asyncio.Queue(maxsize=_QUEUE_LIMIT)
        self._task: asyncio.Task[None] | None = None
        self._last_warning = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def clear(self) -> None:
        """Forget queued events (used by /_control/reset)."""
        while not self._queue.empty():
            self._queue.get_nowait()

    def publish(self, exchange: str, routing_key: str, body: bytes, queue: str | None) -> None:
        if not self.connected:
            self.world.stats.rmq_failed += 1
            self._warn(f"RabbitMQ unavailable, dropping {routing_key} for {exchange}")
            return
        try:
            self._queue.put_nowait((exchange, routing_key, body, queue))
        except asyncio.QueueFull:
            self.world.stats.rmq_failed += 1
            self._warn("RabbitMQ publish queue full, dropping events")

    def _warn(self, text: str) -> None:
        # Rate-limited: a broker outage under load would otherwise flood stderr.
        now = time.monotonic()
        if now - self._last_warning > 5:
            self._last_warning = now
            log.warning(text)

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            connection: AbstractConnection | None = None
            try:
                connection = await aio_pika.connect(self.url, timeout=5)
                channel = await connection.channel(publisher_confirms=False)
                closed = asyncio.Event()

                def on_close(*_: Any) -> None:
                    closed.set()
                    with contextlib.suppress(asyncio.QueueFull):
                        self._queue.put_nowait(None)  # wake the pump

                connection.close_callbacks.add(on_close)
                channel.close_callbacks.add(on_close)
                self.connected = True
                backoff = 0.5
                log.info("RabbitMQ connected")
                await self._pump(channel, closed)
                self._last_warning = 0.0  # always report the loss itself
                self._warn("RabbitMQ connection lost; dropping events until it is back")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any broker/network failure: reconnect later
                self._warn(f"RabbitMQ unavailable ({type(exc).__name__}: {exc}); retrying")
            finally:
                self.connected = False
                dropped = 0
                while not self._queue.empty():
                    if self._queue.get_nowait() is not None:
                        dropped += 1
                self.world.stats.rmq_failed += dropped
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(connection.close(), 2)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    async def _pump(self, channel: AbstractChannel, closed: asyncio.Event) -> None:
        declared_exchanges: set[str] = set()
        declared_queues: set[tuple[str, str, str]] = set()
        raw = await channel.get_underlay_channel()
        sent = 0
        while not closed.is_set():
            item = await self._queue.get()
            if item is None:
                continue
            exchange, routing_key, body, queue = item
            if exchange not in declared_exchanges:
                await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True, auto_delete=False)
                declared_exchanges.add(exchange)
            if queue and self.world.cfg.declare_queues and (queue, exchange, routing_key) not in declared_queues:
                # Evolution asserts a quorum queue per event and binds it with the dotted key.
                q = await channel.declare_queue(queue, durable=True, auto_delete=False,
                                                arguments={"x-queue-type": "quorum"})
                await q.bind(exchange, routing_key=routing_key)
                declared_queues.add((queue, exchange, routing_key))
            sent += 1
            await _publish_raw(raw, exchange, routing_key, body, wait=sent % _DRAIN_EVERY == 0)
            self.world.stats.rmq_published += 1


async def _publish_raw(raw: Any, exchange: str, routing_key: str, body: bytes, wait: bool) -> None:
    """basic.publish with an empty property set (see module docstring)."""
    try:
        from aiormq.abc import ChannelFrame
    except ImportError:  # pragma: no cover - other aiormq layouts
        await raw.basic_publish(body, exchange=exchange, routing_key=routing_key,
                                properties=spec.Basic.Properties())
        return
    frames: list[Any] = [
        spec.Basic.Publish(exchange=exchange, routing_key=routing_key),
        ContentHeader(body_size=len(body), properties=spec.Basic.Properties()),
        *raw._split_body(body),
    ]
    drain = raw.create_future() if wait else None
    await raw.write_queue.put(ChannelFrame.marshall(channel_number=raw.number, frames=frames, drain_future=drain))
    if drain is not None:
        await drain
