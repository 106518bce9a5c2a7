"""The Celery app, its lanes and its beat entries: queue names live here and nowhere else."""

from __future__ import annotations

import os

from typing import Any

from celery import Celery
from celery.signals import task_prerun, worker_process_shutdown
from kombu import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pilot_status.settings")

app = Celery("pilot_status")
app.config_from_object("django.conf:settings", namespace="CELERY")

# One queue per category so that a marketing blast never sits in front of an OTP (design.md §4).
LANES = ("otp", "utility", "marketing")
MAINTENANCE_QUEUE = "maintenance"
SEND_TASK = "messaging.send_message"

_exchange = Exchange("pilot_status", type="direct", durable=True)
app.conf.task_queues = [Queue(name, _exchange, routing_key=name, durable=True) for name in LANES] + [
    Queue(MAINTENANCE_QUEUE, _exchange, routing_key=MAINTENANCE_QUEUE, durable=True)
]
app.conf.update(
    task_default_queue=MAINTENANCE_QUEUE,
    task_default_exchange="pilot_status",
    task_default_routing_key=MAINTENANCE_QUEUE,
)
# Send tasks are routed per message by the relay (lane_for); everything else is maintenance.
app.conf.task_routes = {
    "messaging.reconcile_messages": {"queue": MAINTENANCE_QUEUE},
    "messaging.sync_statuses": {"queue": MAINTENANCE_QUEUE},
    "messaging.poll_instance_states": {"queue": MAINTENANCE_QUEUE},
    "ingestion.reconcile_events": {"queue": MAINTENANCE_QUEUE},
    "dashboard.run_bulk_resend": {"queue": MAINTENANCE_QUEUE},
}


def lane_for(category: str) -> str:
    """The queue a message of this category is sent through."""
    lane = category.lower()
    if lane not in LANES:
        raise ValueError(f"no lane for category {category!r}")
    return lane


# Read from the environment directly: touching django.conf.settings while this module is imported
# (from pilot_status/__init__) would load the settings module half-imported. settings.py
# validates the same variable (INGESTION_RECONCILE_SECONDS) at start-up.
_INGESTION_RECONCILE_SECONDS = int(os.environ.get("INGESTION_RECONCILE_SECONDS") or 300)

# Each entry names its queue and expires: a beat tick that waited longer than its own period is
# stale, and the next tick will do the same work (saleor CELERY_BEAT_SCHEDULE).
app.conf.beat_schedule = {
    "reconcile-messages": {
        "task": "messaging.reconcile_messages",
        "schedule": 10.0,
        "options": {"queue": MAINTENANCE_QUEUE, "expires": 10},
    },
    "sync-statuses": {
        "task": "messaging.sync_statuses",
        "schedule": 60.0,
        "options": {"queue": MAINTENANCE_QUEUE, "expires": 60},
    },
    # Safety net for a lost connection.update: instances we think are down but hold messages.
    "poll-instance-states": {
        "task": "messaging.poll_instance_states",
        "schedule": 15.0,
        "options": {"queue": MAINTENANCE_QUEUE, "expires": 15},
    },
    "reconcile-ingestion": {
        "task": "ingestion.reconcile_events",
        "schedule": float(_INGESTION_RECONCILE_SECONDS),
        "options": {"queue": MAINTENANCE_QUEUE, "expires": _INGESTION_RECONCILE_SECONDS},
    },
}

# Celery's Django fixup closes the database connection before and after every task unless
# CELERY_DB_REUSE_MAX is set: opening a new Postgres backend per message took a sixth of a lane
# worker's time (bench B2 profile). Reuse it; Django's own rules still drop a connection that is
# too old, has seen an error, or fails its health check, before each task (below).
app.conf.CELERY_DB_REUSE_MAX = 10_000


@task_prerun.connect
def _drop_stale_connection(**kwargs: Any) -> None:
    from django.db import close_old_connections

    close_old_connections()


@worker_process_shutdown.connect
def _send_waiting_counts(**kwargs: Any) -> None:
    # A pool process ends with os._exit, past atexit: its last counts (pilot_status.metrics) go now.
    from pilot_status import metrics

    metrics.flush()


app.autodiscover_tasks(["messaging", "messaging.sending", "ingestion", "dashboard"])
