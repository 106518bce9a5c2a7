"""The RabbitMQ channel of dual ingestion (docs/internals.md, "Path of an event").

Our own durable quorum queue is bound with `#` to Evolution's topic exchange (global mode) and,
in per-instance mode, to the exchange Evolution names after each instance; the set of instance
exchanges is re-read from the database while running, so instances added later are followed.
Evolution's own quorum queues are never declared: declaring one of their names with other
arguments fails the channel with PRECONDITION_FAILED.

Per message: lock → inbox (channel RABBITMQ, committed) → forward to the webhook handler with
already_saved → ack (acks go in batches of CONSUMER_ACK_BATCH, acks.py). A copy whose lock holds the
done mark (the webhook processed the event) is acked without a database statement (locks.py). A copy
whose lock the other channel holds is kept unacked and looked at again every LOCK_WAIT_S, up to
LOCK_WAIT_TRIES times (lockwait.py), and only then waits in the 5 s delay queue. Every failure goes
through `_retry_later`, which moves the message to a delay queue (per-queue TTL, dead-lettered back to
the work queue: 5 s, 30 s, 3 min) and finally to a parking queue; a lock still held after the local
looks or a database outage waits in a delay queue without using a retry. Nothing is ever requeued
straight back (no hot loop).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from django.db.models import F
from kombu import Connection, Consumer, Exchange, Producer, Queue, binding
from kombu.mixins import ConsumerMixin

from pilot_status import jsonbody, metrics

from . import forwarding, inbox, sizes
from .acks import DeferredAcks
from .locks import event_lock
from .lockwait import LockWaits
from .models import Channel, IngestionEvent

log = logging.getLogger(__name__)

RETRY_DELAYS_S = (5, 30, 180)
# A lock held by the other channel is released within milliseconds: look again after LOCK_WAIT_S,
# up to LOCK_WAIT_TRIES times (lockwait.py), then come back after the shortest delay. A database
# outage lasts longer: wait in the 30 s queue, retries untouched.
LOCK_WAIT_S = 0.1
LOCK_WAIT_TRIES = 3
LOCKED_DELAY_S = RETRY_DELAYS_S[0]
DB_DOWN_DELAY_S = RETRY_DELAYS_S[1]
CONNECTION_CHECK_SECONDS = 1.0
# Handled deliveries are acked CONSUMER_ACK_BATCH (20) at a time, or once the oldest waited 0.1 s
# (acks.py); CONSUMER_ACK_BATCH=1 acks each one at once. The prefetch leaves room for the next batch
# while one waits for its ack (settings refuse a batch larger than it), and bounds how many copies are
# kept for another look at a lock held elsewhere (lockwait.py).
PREFETCH = 100
ACK_MAX_DELAY_S = 0.1
CONFIRM_TIMEOUT_S = 10.0
RETRY_HEADER = "x-ps-retries"
ERROR_HEADER = "x-ps-last-error"
WAITING = "waiting"  # what `handle` answers for a delivery kept for another look


@dataclass(frozen=True)
class QueueNames:
    prefix: str

    @property
    def work(self) -> str:
        return f"{self.prefix}.ingest"

    @property
    def parking(self) -> str:
        return f"{self.prefix}.parked"

    def retry(self, delay: int) -> str:
        return f"{self.prefix}.retry.{delay}s"


def queue_names() -> QueueNames:
    return QueueNames(settings.EVOLUTION_RABBITMQ_QUEUE_PREFIX)


def evolution_exchange(name: str) -> Exchange:
    # Exactly what Evolution asserts (topic, durable, not auto-delete), so declaring it first
    # (a binding to a missing exchange would close the channel) never conflicts.
    return Exchange(name, type="topic", durable=True, auto_delete=False)


def exchange_names(instance_names: list[str] | None = None) -> list[str]:
    """Global mode: Evolution's exchange. Per-instance mode: plus one exchange per instance."""
    names = [settings.EVOLUTION_RABBITMQ_EXCHANGE]
    if settings.EVOLUTION_RABBITMQ_PER_INSTANCE:
        names += sorted({n for n in instance_names or [] if n and n not in names})
    return names


@dataclass
class Topology:
    names: QueueNames
    exchanges: list[Exchange]
    work: Queue
    retries: list[Queue] = field(default_factory=list)
    parking: Queue | None = None


def topology(instance_names: list[str] | None = None, names: QueueNames | None = None) -> Topology:
    names = names or queue_names()
    exchanges = [evolution_exchange(n) for n in exchange_names(instance_names)]
    work = Queue(
        names.work,
        bindings=[binding(e, routing_key="#") for e in exchanges],
        durable=True,
        queue_arguments={"x-queue-type": "quorum"},
    )
    retries = [
        Queue(
            names.retry(delay),
            durable=True,
            queue_arguments={
                "x-queue-type": "quorum",
                "x-message-ttl": delay * 1000,
                # Expired messages go back to the work queue through the default exchange.
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": names.work,
            },
        )
        for delay in RETRY_DELAYS_S
    ]
    parking = Queue(names.parking, durable=True, queue_arguments={"x-queue-type": "quorum"})
    return Topology(names, exchanges, work, retries, parking)


def instance_names_from_db() -> list[str] | None:
    """The instances to follow in per-instance mode; None when the database cannot say now."""
    from messaging.models import Instance

    try:
        close_old_connections()
        return list(Instance.objects.values_list("name", flat=True))
    except (OperationalError, InterfaceError) as exc:
        log.warning("cannot read instances (%s); keeping the current bindings", exc)
        connection.close()
        return None


class EvolutionConsumer(ConsumerMixin):  # type: ignore[misc]
    def __init__(
        self,
        connection: Connection,
        topo: Topology,
        instance_source: Callable[[], list[str] | None] | None = None,
        refresh_seconds: float | None = None,
    ):
        self.connection = connection
        self.topology = topo
        self.instance_source = instance_source
        self.refresh_seconds = refresh_seconds if refresh_seconds is not None else settings.EVOLUTION_RABBITMQ_REFRESH_SECONDS
        self.bound: set[str] = {e.name for e in topo.exchanges}
        self.channel: Any = None
        self.next_refresh = time.monotonic() + self.refresh_seconds
        self.handled = 0  # deliveries settled; a copy kept for another look (lockwait.py) counts once settled
        self.next_connection_check = 0.0
        self.arrived: deque[Any] = deque()  # deliveries waiting for the one being handled
        self.handling = False
        self.acks = DeferredAcks(settings.CONSUMER_ACK_BATCH, ACK_MAX_DELAY_S)
        self.waits = LockWaits(LOCK_WAIT_TRIES, LOCK_WAIT_S)  # kept while the other channel holds the lock
        # Set by run_consumer: beats from the consuming loop, so a consumer that is killed, stuck, or
        # cut off from RabbitMQ turns stale on the status page (pilot_status.heartbeats).
        self.heartbeat: Any = None

    # ---- topology ------------------------------------------------------------------------

    def get_consumers(self, consumer_cls: Any, channel: Any) -> list[Consumer]:
        self.channel = channel
        self.acks.forget()  # a new channel: the old one's unacked deliveries come again
        self.waits.forget()
        for queue in [*self.topology.retries, self.topology.parking]:
            assert queue is not None
            queue.bind(channel).declare()
        # After a reconnect, also bind exchanges learnt while running (bindings are idempotent).
        self.topology.work.bindings = {binding(evolution_exchange(n), routing_key="#") for n in sorted(self.bound)}  # type: ignore[assignment]
        consumer = consumer_cls(queues=[self.topology.work], callbacks=[self.on_message], accept=None, prefetch_count=PREFETCH)
        return [consumer]

    def consume(
        self, limit: int | None = None, timeout: int | None = None, safety_interval: float = ACK_MAX_DELAY_S, **kwargs: Any
    ) -> Any:
        # Wake at least every ACK_MAX_DELAY_S, so that on_iteration acks a trickle in time.
        return super().consume(limit, timeout, safety_interval, **kwargs)  # type: ignore[arg-type,func-returns-value]

    @contextmanager
    def extra_context(self, connection: Any, channel: Any) -> Iterator[None]:  # type: ignore[override]
        # Entered around the consuming loop, and left while the connection is still open, on
        # every way out: a stop, an error, or a caller that closes the loop.
        try:
            yield
        finally:
            self._flush_acks()

    def _flush_acks(self) -> None:
        try:
            for message in self.waits.take_all():  # kept for another look: handed back untouched
                self._hand_back(message)
            self.acks.flush()
        except (*self.connection.connection_errors, *self.connection.channel_errors) as exc:
            # Not acked: the broker redelivers them and the done mark or the inbox skips them.
            log.info("could not ack the last handled deliveries (%s); they will come again", exc)
            self.acks.forget()
            self.waits.forget()

    def _hand_back(self, message: Any) -> None:
        message.requeue()
        self.waits.done(message)
        self.acks.drop(message)

    def on_iteration(self) -> None:
        self.acks.flush_if_due()
        if self.waits:
            self._look_again()
        if self.heartbeat is not None:
            self.heartbeat.beat()
        if self.instance_source is None or not settings.EVOLUTION_RABBITMQ_PER_INSTANCE:
            return
        if time.monotonic() < self.next_refresh:
            return
        self.next_refresh = time.monotonic() + self.refresh_seconds
        self.refresh_bindings()

    def refresh_bindings(self) -> list[str]:
        """Bind the work queue to the exchanges of instances added since the last look."""
        assert self.instance_source is not None
        found = self.instance_source()
        if found is None or self.channel is None:
            return []
        added = [n for n in exchange_names(found) if n not in self.bound]
        for name in added:
            exchange = evolution_exchange(name)
            exchange.bind(self.channel).declare()
            self.channel.queue_bind(self.topology.work.name, exchange=name, routing_key="#")
            self.bound.add(name)
            log.info("following instance exchange %s", name)
        return added

    def on_connection_error(self, exc: Exception, interval: float) -> None:
        log.warning("RabbitMQ unavailable (%s); reconnecting in %.0fs", exc, interval)

    # ---- messages ------------------------------------------------------------------------

    def on_message(self, body: Any, message: Any) -> None:
        # A copy moved to a delay queue waits for the broker's confirm, and py-amqp hands
        # deliveries that arrive meanwhile to this callback from inside that wait. Handled there,
        # a nested publish could take the confirm meant for the outer one (RabbitMQ confirms
        # several publishes with one `multiple` ack) and leave the outer wait blocked until the
        # broker drops the connection for missed heartbeats. So they queue up and are handled
        # one after the other once the current message is done.
        self.arrived.append(message)
        self._handle_arrived()

    def _look_again(self) -> None:
        # Kept deliveries whose look is due (lockwait.py) take the same one-at-a-time path.
        due = self.waits.due()
        if due:
            self.arrived.extend(due)
            self._handle_arrived()

    def _handle_arrived(self) -> None:
        if self.handling:
            return
        self.handling = True
        try:
            while self.arrived:
                self._on_one(self.arrived.popleft())
        except BaseException:
            # The broker went away: it redelivers these and the unacked ones on the next connection.
            self.arrived.clear()
            self.acks.forget()
            self.waits.forget()
            raise
        finally:
            self.handling = False

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        # kombu could not decode the body for us (no content type and not UTF-8). Its default acks
        # it, dropping it unseen; ours takes it the usual way (`handle` reads the raw bytes), which
        # parks it as not an event, where an operator can look at it.
        self.on_message(None, message)

    def _on_one(self, message: Any) -> None:
        if self.should_stop:
            # Stopping (SIGTERM): up to prefetch_count messages can still be in this batch, each a
            # forward of up to its timeout; hand them back to the queue untouched instead, so that
            # the process stops within one message (honcho and Docker kill it after a few seconds).
            self._hand_back(message)
            return
        try:
            if self.handle(message) == WAITING:
                return  # kept for another look: not handled yet
        except self.connection.connection_errors:
            raise  # the broker went away: the unacked message is redelivered after reconnecting
        except Exception as exc:  # the one error path (zulip _handle_consume_exception)
            log.exception("ingestion consumer failed on a message")
            self._retry_later(message, f"{exc.__class__.__name__}: {exc}")
        self.waits.done(message)
        self.handled += 1

    def handle(self, message: Any) -> str:
        body_size = len(message.body) if isinstance(message.body, (bytes, bytearray, str)) else 0
        if sizes.too_large(body_size):
            # Refused as the webhook refuses it (ingestion.sizes): never stored, so never forwarded again;
            # kept in the parking queue where an operator looks.
            log.warning("parking an event of %d bytes, over EVOLUTION_EVENT_MAX_BYTES", body_size)
            metrics.evolution("rabbitmq:too_large")
            self._park(message, f"event of {body_size} bytes, over EVOLUTION_EVENT_MAX_BYTES")
            return "parked"
        payload = _decode(message.body)
        if payload is None or not inbox.is_evolution_event(payload):
            log.warning("parking a message that is not an Evolution event")
            self._park(message, "not an Evolution event")
            return "parked"
        self._check_connection()
        with event_lock(inbox.dedup_key(payload), skipped_counter="rabbitmq:skipped") as hold:
            if hold.done:  # the webhook processed it (committed): no statement; counted by the lock
                self.acks.add(message)
                return "skipped"
            if not hold:
                # The webhook channel is on it right now: keep it and look again shortly
                # (lockwait.py); after the last look, in the 5 s delay queue, never an immediate requeue.
                waited = self.waits.keep(message)
                if waited:
                    if waited == 1:
                        hold.count("rabbitmq:lock_waited")
                        self.acks.hold(message)  # no `multiple` ack of a later delivery acks it
                    return WAITING
                hold.count("rabbitmq:requeued")
                self._delay(message, LOCKED_DELAY_S, count_as_retry=False, reason="locked by another channel")
                return "requeued"
            try:
                event, _ = inbox.record(Channel.RABBITMQ, payload)
            except (OperationalError, InterfaceError) as exc:
                connection.close()  # a dead connection is not reused for the next message
                hold.count("rabbitmq:db_unavailable")
                self._delay(message, DB_DOWN_DELAY_S, count_as_retry=False, reason=f"database unavailable: {exc}")
                return "db_unavailable"
            # The row is committed (autocommit); only now may the message be acked.
            if event.processed_at is not None:
                hold.finish()
                hold.count("rabbitmq:skipped")
                self.acks.add(message)
                return "skipped"
            ok, error = forwarding.forward(payload)
            if ok:
                hold.count("rabbitmq:forward_ok")
                self.acks.add(message)
                return "forwarded"
            hold.count("rabbitmq:forward_fail")
            _note_failure(event, error)
            self._retry_later(message, error)
            return "retry"

    def _check_connection(self) -> None:
        # close_old_connections() drops an obsolete connection; with CONN_HEALTH_CHECKS it also
        # costs a `SELECT 1` before the next query. Once a second is enough: a connection that
        # died meanwhile fails one message, which is closed and delayed like any outage below.
        now = time.monotonic()
        if now >= self.next_connection_check:
            self.next_connection_check = now + CONNECTION_CHECK_SECONDS
            close_old_connections()

    def _retry_later(self, message: Any, reason: str) -> None:
        retries = _retries(message)
        if retries >= len(RETRY_DELAYS_S):
            self._park(message, reason)
            return
        self._delay(message, RETRY_DELAYS_S[retries], count_as_retry=True, reason=reason)

    def _delay(self, message: Any, delay: int, count_as_retry: bool, reason: str) -> None:
        retries = _retries(message) + (1 if count_as_retry else 0)
        self._publish(message, self.topology.names.retry(delay), {RETRY_HEADER: retries, ERROR_HEADER: reason[:200]})

    def _park(self, message: Any, reason: str) -> None:
        metrics.evolution("rabbitmq:parked")
        self._publish(message, self.topology.names.parking, {ERROR_HEADER: reason[:200]})

    def _publish(self, message: Any, queue_name: str, headers: dict[str, Any]) -> None:
        # Publish the copy first, then ack the original: a crash in between duplicates the
        # event (the inbox dedups it), never loses it.
        producer = Producer(message.channel, exchange=Exchange(""), routing_key=queue_name)
        # A confirm that never comes ends as a connection error (reconnect; the unacked original
        # is redelivered), never as a consumer blocked for good.
        producer.publish(message.body, headers=headers, delivery_mode=2, confirm_timeout=CONFIRM_TIMEOUT_S)
        self.acks.add(message)


def _retries(message: Any) -> int:
    try:
        return int((message.headers or {}).get(RETRY_HEADER, 0))
    except (TypeError, ValueError):
        return 0


def _note_failure(event: IngestionEvent, error: str) -> None:
    try:
        IngestionEvent.objects.filter(pk=event.pk).update(
            forward_attempts=F("forward_attempts") + 1, last_error=error[:500]
        )
    except Exception:  # bookkeeping only
        log.debug("could not note the failed forward of event %s", event.pk)


def _decode(body: Any) -> Any:
    """The parsed event, or None (parked): the webhook's bounded reader (pilot_status.jsonbody), so a
    body nested too deep, with an endless number or broken UTF-8 is parked at once instead of
    failing three delay rounds first, and nothing the webhook would refuse is stored here."""
    if isinstance(body, (bytes, bytearray, str)):
        try:
            return jsonbody.loads(bytes(body) if isinstance(body, bytearray) else body)
        except jsonbody.JsonBodyError:
            return None
    return body if isinstance(body, dict) else None
