"""Publish a relay pass's send tasks and know the broker holds them before the outbox forgets them.

Without publisher confirms `basic.publish` returns before RabbitMQ has taken the message: a broker
that dies, refuses (a full disk, a memory alarm) or drops the channel a moment later loses the task
while the relay deletes its outbox row, and only the reconciler's sweep finds the message again.
Here a pass publishes its whole batch on one channel in confirm mode, then waits once for the
broker's acks: the relay commits the release only when every task of it is confirmed (queued on a
durable queue, persisted), so the broker's loss costs nothing but a retry. One wait per pass rather
than per task: RabbitMQ confirms persistent messages after its own disk sync, and the relay would
otherwise pay one sync per message.

Anything that goes wrong (a nack, a return, a timeout, a lost connection) drops the connection and
raises: the release's transaction rolls back, its rows stay due, and tasks that did reach the broker
become duplicates that the worker's lease claim turns into no-ops. Only a connection kept from an
earlier pass that turns out dead gets one more try at once, on a new connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from kombu import Connection, Producer

from pilot_status.celery import SEND_TASK, app

log = logging.getLogger(__name__)


class PublishNotConfirmed(Exception):
    """The broker refused a task of the batch, or did not confirm all of it in time."""


class LanePublisher:
    """One connection and one confirm-mode channel, kept across passes (the relay is one process)."""

    def __init__(self, confirm_timeout: float) -> None:
        self.confirm_timeout = confirm_timeout
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        self._published = 0  # delivery tags run 1, 2, … on the channel since confirm.select
        self._unconfirmed: set[int] = set()
        self._refused = 0
        self._returned = 0

    def publish(self, lane: str, message_ids: Iterable[str]) -> int:
        """Publish one send task per message on `lane`; return once the broker has confirmed them all."""
        ids = list(message_ids)
        if not ids:
            return 0
        kept = self._producer is not None
        try:
            self._publish_and_confirm(lane, ids)
        except PublishNotConfirmed:
            self.close()
            raise
        except Exception:
            self.close()
            if not kept:
                raise
            # A connection kept since an earlier pass may have died meanwhile (a broker restart, a
            # connection closed by an operator): try once more on a fresh one. Tasks the old one got
            # out are duplicates that the lease claim ignores.
            log.info("lane publisher: kept connection failed; publishing on a new one", exc_info=True)
            try:
                self._publish_and_confirm(lane, ids)
            except Exception:
                self.close()
                raise
        return len(ids)

    def _publish_and_confirm(self, lane: str, ids: list[str]) -> None:
        producer = self._ready_producer()
        for message_id in ids:
            # retry=False: kombu's retry would reconnect on a fresh channel, outside confirm mode
            # and with the delivery tags starting over. A failure raises and the pass is retried.
            # mandatory: a task no queue takes (the lane's queue deleted) comes back instead of
            # being confirmed and dropped.
            app.send_task(SEND_TASK, args=[message_id], queue=lane, routing_key=lane,
                          producer=producer, retry=False, mandatory=True)
            self._published += 1
            self._unconfirmed.add(self._published)
        self._wait_for_confirms()

    def close(self) -> None:
        connection, self._connection, self._producer = self._connection, None, None
        self._published, self._unconfirmed, self._refused, self._returned = 0, set(), 0, 0
        if connection is not None:
            # Without the close handshake: a broker that blocks publishers (an alarm) never reads
            # it, and waiting for its close-ok would hang the relay.
            connection.collect()

    def _ready_producer(self) -> Producer:
        if self._producer is None:
            # No heartbeats: the relay only reads this connection while it waits for confirms, so an
            # idle night would miss the broker's heartbeats and be dropped. A dead connection shows at
            # the next publish (one more try) or as an unconfirmed batch (the timeout).
            connection = app.connection_for_write(heartbeat=0)
            connection.ensure_connection(max_retries=1)
            channel: Any = connection.channel()
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            channel.events["basic_return"].add(self._on_return)
            self._connection, self._producer = connection, Producer(channel)
        return self._producer

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._refused += len(self._settle(delivery_tag, multiple))

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self._returned += 1  # the broker confirms a returned task too, after the return

    def _settle(self, delivery_tag: int, multiple: bool) -> set[int]:
        settled = {tag for tag in self._unconfirmed if tag <= delivery_tag} if multiple else {delivery_tag}
        self._unconfirmed -= settled
        return settled

    def _wait_for_confirms(self) -> None:
        assert self._connection is not None
        deadline = time.monotonic() + self.confirm_timeout
        while self._unconfirmed and not self._refused:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishNotConfirmed(
                    f"{len(self._unconfirmed)} send task(s) not confirmed by the broker within {self.confirm_timeout:g} s")
            try:
                self._connection.drain_events(timeout=remaining)
            except TimeoutError:
                continue  # the loop's deadline check raises
        if self._refused:
            raise PublishNotConfirmed(f"the broker refused {self._refused} send task(s) (basic.nack)")
        if self._returned:
            raise PublishNotConfirmed(f"no queue took {self._returned} send task(s) (basic.return: lane queue missing)")
