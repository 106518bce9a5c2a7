"""Ingestion: Evolution's webhooks and our own forwards, the RabbitMQ consumer, the inbox and its reconciler,
and retention."""

from __future__ import annotations

from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured

from ..envparse import envbool, envfloat, envint, envstr, envurl
from .security import ALLOWED_HOSTS


# Where the RabbitMQ consumer and the ingestion reconciler forward events (docs/internals.md, "Path of an event").
INTERNAL_WEBHOOK_URL = envurl(
    "INTERNAL_WEBHOOK_URL",
    ("http", "https"),
    f"http://127.0.0.1:{envint('PORT', 8000)}/api/internal/webhook",
)
PORT = envint("PORT", 8000, minimum=1)
# Our own forwards name this host; where it is the web pool (a one-process deployment), Django's
# host check would refuse them with 400 unless it is allowed. The webhook pool checks no host.
# It joins security.py's ALLOWED_HOSTS list itself, the one list Django reads.
_INTERNAL_HOST = urlparse(INTERNAL_WEBHOOK_URL).hostname or ""
if ":" in _INTERNAL_HOST:
    _INTERNAL_HOST = f"[{_INTERNAL_HOST}]"
if _INTERNAL_HOST and "*" not in ALLOWED_HOSTS and _INTERNAL_HOST not in ALLOWED_HOSTS:
    ALLOWED_HOSTS.append(_INTERNAL_HOST)

# Evolution's RabbitMQ, where it publishes its events (the second ingestion channel beside the webhook);
# empty: webhook only. The exchange is Evolution's RABBITMQ_EXCHANGE_NAME.
EVOLUTION_RABBITMQ_URL = envstr("EVOLUTION_RABBITMQ_URL", "")
if EVOLUTION_RABBITMQ_URL:
    envurl("EVOLUTION_RABBITMQ_URL", ("amqp", "amqps"))
EVOLUTION_RABBITMQ_EXCHANGE = envstr("EVOLUTION_RABBITMQ_EXCHANGE", "evolution_exchange")
# Per-instance mode: Evolution publishes on an exchange named after each instance.
EVOLUTION_RABBITMQ_PER_INSTANCE = envbool("EVOLUTION_RABBITMQ_PER_INSTANCE", False)
# The consumer acks handled deliveries this many at a time (one `multiple` ack: a quorum queue settles
# each ack through its log), or once the oldest waited 0.1 s (ingestion.acks); 1 acks each delivery at
# once. At most the consumer's prefetch (100): a larger batch could never fill.
CONSUMER_ACK_BATCH = envint("CONSUMER_ACK_BATCH", 20, minimum=1)
if CONSUMER_ACK_BATCH > 100:
    raise ImproperlyConfigured(f"CONSUMER_ACK_BATCH must be at most 100 (the consumer's prefetch), got {CONSUMER_ACK_BATCH}")

# Evolution's webhooks per authenticated instance (issue 21): past it they are shed with 429 and
# Retry-After, which Evolution retries. Far above real traffic (one number's receipts are a few
# per message sent) and above what the bench pushes through one instance (B5: about 600/s); it
# stops a runaway or hostile sender, not load. Our own forwards are never limited.
WEBHOOK_RATE_PER_INSTANCE = envfloat("WEBHOOK_RATE_PER_INSTANCE", 1000.0, above=0)
WEBHOOK_RATE_BURST = envint("WEBHOOK_RATE_BURST", 2000, minimum=1)

# Dual ingestion (issue 5). Our RabbitMQ queues are named <prefix>.ingest / .retry.<n>s / .parked;
# in per-instance mode the consumer re-reads the instance list this often to bind new exchanges.
EVOLUTION_RABBITMQ_QUEUE_PREFIX = envstr("EVOLUTION_RABBITMQ_QUEUE_PREFIX", "pilot_status.evolution")
EVOLUTION_RABBITMQ_REFRESH_SECONDS = envint("EVOLUTION_RABBITMQ_REFRESH_SECONDS", 30, minimum=1)
# Ingestion reconciler: period of its beat entry, and how old an unprocessed event must be.
INGESTION_RECONCILE_SECONDS = envint("INGESTION_RECONCILE_SECONDS", 300, minimum=1)
INGESTION_STALE_AFTER_SECONDS = envint("INGESTION_STALE_AFTER_SECONDS", 120, minimum=0)
# An unprocessed event forwarded this many times without being taken is given up: the reconciler marks it
# processed with outcome `dead` (its last_error kept; visible in the admin's inbox), and retention prunes it.
INGESTION_MAX_FORWARDS = envint("INGESTION_MAX_FORWARDS", 10, minimum=1)
# The size bound of one Evolution event, on the webhook and on RabbitMQ alike (ingestion.sizes), apart from
# the client API's MAX_REQUEST_BODY_BYTES: a media message's caption and thumbnail, or a messages.set history
# batch, outgrow 64 KiB. Over it, the webhook answers 413 and the consumer parks the message; neither stores it.
EVOLUTION_EVENT_MAX_BYTES = envint("EVOLUTION_EVENT_MAX_BYTES", 4 * 1024 * 1024, minimum=64 * 1024)

# Maintenance (issue 22). Beat periods (pilot_status/celery.py reads the same variables; checked here).
RETENTION_SECONDS = envfloat("RETENTION_SECONDS", 600.0, above=0)
# Time budget of one pass (checked between messages or batches): a slow Evolution or a big backlog
# ends the pass early, the next tick goes on. Celery's soft time limit backs each one up.
RETENTION_PASS_SECONDS = envfloat("RETENTION_PASS_SECONDS", 30.0, above=0)
# Retention: processed inbox rows (raw payloads, inbound customer messages) and the timeline lines
# of finished messages are deleted after this many days, 1,000 rows per statement.
INBOX_RETENTION_DAYS = envint("INBOX_RETENTION_DAYS", 30, minimum=1)
TIMELINE_RETENTION_DAYS = envint("TIMELINE_RETENTION_DAYS", 90, minimum=1)
