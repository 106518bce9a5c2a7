"""The RabbitMQ channel of dual ingestion (seeds.md B, channel 2).

Our own durable queue is bound to Evolution's topic exchange(s); Evolution's quorum queues are
never redeclared (services.md). Per message: lock → inbox (channel RABBITMQ) → forward to the
webhook handler with already_saved → ack. Every failure goes through `_retry_later`, which moves
the message to a delay queue (per-queue TTL, dead-lettered back to the work queue: 5 s, 30 s,
3 min) and finally to a parking queue, so a failing forward is never a hot requeue loop.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.mixins import ConsumerMixin

from pilot_status import metrics

from . import inbox
from .models import Channel
from .receive import LOCK_PREFIX, LOCK_TTL_SECONDS

log = logging.getLogger(__name__)

WORK_QUEUE = "pilot_status.evolution.ingest"
PARKING_QUEUE = "pilot_status.evolution.parked"
RETRY_DELAYS_S = (5, 30, 180)
RETRY_HEADER = "x-ps-retries"


def retry_queue_name(delay: int) -> str:
    return f"pilot_status.evolution.retry.{delay}s"


@dataclass(frozen=True)
class Topology:
    exchanges: list[Exchange]
    work: Queue
    retries: list[Queue]
    parking: Queue


def topology(instance_names: list[str] | None = None) -> Topology:
    """Our queues, bound to the global exchange and (per-instance mode) one exchange per instance."""
    names = [settings.EVOLUTION_RABBITMQ_EXCHANGE]
    if settings.EVOLUTION_RABBITMQ_PER_INSTANCE:
        names += [n for n in instance_names or [] if n not in names]
    # Same type and durability Evolution asserts (topic, durable), so declaring is harmless.
    exchanges = [Exchange(name, type="topic", durable=True, auto_delete=False) for name in names]
    work = Queue(
        WORK_QUEUE,
        bindings=[_binding(e) for e in exchanges],
        durable=True,
        queue_arguments={"x-queue-type": "quorum"},
    )
    retries = [
        Queue(
            retry_queue_name(delay),
            durable=True,
            queue_arguments={
                "x-queue-type": "quorum",
                "x-message-ttl": delay * 1000,
                # Expired messages return to the work queue through the default exchange.
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": WORK_QUEUE,
            },
        )
        for delay in RETRY_DELAYS_S
    ]
    parking = Queue(PARKING_QUEUE, durable=True, queue_arguments={"x-queue-type": "quorum"})
    return Topology(exchanges, work, retries, parking)


def _binding(exchange: Exchange) -> Any:
    from kombu import binding

    return binding(exchange, routing_key="#")


def forward(payload: dict[str, Any], timeout: float = 10.0) -> tuple[bool, str]:
    """POST the saved event to the webhook handler with already_saved (seeds B)."""
    body = dict(payload)
    body["already_saved"] = True
    try:
        response = requests.post(
            settings.INTERNAL_WEBHOOK_URL,
            json=body,
            headers={"x-internal-webhook-secret": settings.INTERNAL_WEBHOOK_SECRET},
            timeout=timeout,
        )
    except requests.RequestException as exc:
        return False, f"{exc.__class__.__name__}: {exc}"[:300]
    if 200 <= response.status_code < 300:
        return True, ""
    return False, f"HTTP {response.status_code}: {response.text[:200]}"


class EvolutionConsumer(ConsumerMixin):  # type: ignore[misc]
    def __init__(self, connection: Connection, topo: Topology):
        self.connection = connection
        self.topology = topo
        self.handled = 0

    def get_consumers(self, consumer_cls: type[Consumer], channel: Any) -> list[Consumer]:
        for queue in [*self.topology.retries, self.topology.parking]:
            queue.bind(channel).declare()
        consumer = consumer_cls(
            queues=[self.topology.work], callbacks=[self.on_message], accept=None, prefetch_count=20
        )
        return [consumer]

    def on_connection_error(self, exc: Exception, interval: float) -> None:
        log.warning("RabbitMQ unavailable (%s); reconnecting in %.0fs", exc, interval)

    def on_message(self, body: Any, message: Any) -> None:
        try:
            self.handle(message)
        except Exception as exc:  # the one error path (zulip _handle_consume_exception)
            log.exception("ingestion consumer failed on a message")
            self._retry_later(message, f"{exc.__class__.__name__}: {exc}")
        self.handled += 1

    def handle(self, message: Any) -> str:
        payload = _decode(message.body)
        if payload is None or not inbox.is_evolution_event(payload):
            log.warning("parking a message that is not an Evolution event")
            self._park(message, "not an Evolution event")
            return "parked"
        key = inbox.dedup_key(payload)
        client = _redis()
        if client is not None:
            try:
                if not client.set(LOCK_PREFIX + key, "rabbitmq", nx=True, ex=LOCK_TTL_SECONDS):
                    # The webhook channel is on it right now. Come back after a short delay
                    # instead of spinning on an immediate requeue.
                    metrics.evolution("rabbitmq:requeued")
                    self._delay(message, RETRY_DELAYS_S[0], count_as_retry=False)
                    return "requeued"
            except Exception:
                client = None
        try:
            try:
                event, created = inbox.record(Channel.RABBITMQ, payload)
            except DatabaseError:
                close_old_connections()
                raise
            if event.processed_at is not None:
                metrics.evolution("rabbitmq:skipped")
                message.ack()
                return "skipped"
            ok, error = forward(payload)
            if ok:
                metrics.evolution("rabbitmq:forward_ok")
                message.ack()
                return "forwarded"
            metrics.evolution("rabbitmq:forward_fail")
            self._retry_later(message, error)
            return "retry"
        finally:
            if client is not None:
                try:
                    client.delete(LOCK_PREFIX + key)
                except Exception:
                    pass

    def _retry_later(self, message: Any, reason: str) -> None:
        retries = int((message.headers or {}).get(RETRY_HEADER, 0))
        if retries >= len(RETRY_DELAYS_S):
            self._park(message, reason)
            return
        self._delay(message, RETRY_DELAYS_S[retries], count_as_retry=True, reason=reason)

    def _delay(self, message: Any, delay: int, count_as_retry: bool, reason: str = "") -> None:
        retries = int((message.headers or {}).get(RETRY_HEADER, 0))
        headers = {RETRY_HEADER: retries + 1 if count_as_retry else retries, "x-ps-last-error": reason[:200]}
        self._publish(message, retry_queue_name(delay), headers)

    def _park(self, message: Any, reason: str) -> None:
        self._publish(message, PARKING_QUEUE, {"x-ps-last-error": reason[:200]})

    def _publish(self, message: Any, queue_name: str, headers: dict[str, Any]) -> None:
        # Publish the copy first, then ack the original: a crash in between duplicates the
        # event (the inbox dedups it), never loses it.
        producer = Producer(message.channel, exchange=Exchange(""), routing_key=queue_name)
        producer.publish(message.body, headers=headers, delivery_mode=2)
        message.ack()


def _decode(body: Any) -> Any:
    if isinstance(body, (bytes, bytearray)):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(body, str):
        try:
            return json.loads(body)
        except ValueError:
            return None
    return body if isinstance(body, dict) else None


def _redis() -> Any:
    try:
        return metrics.redis()
    except Exception:
        return None
