"""The Celery app, its lanes and its beat entries: queue names live here and nowhere else."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from celery.signals import (beat_init, task_postrun, task_prerun, worker_process_init, worker_process_shutdown,
                            worker_ready)
from kombu import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pilot_status.settings")

app = Celery("pilot_status")
app.config_from_object("django.conf:settings", namespace="CELERY")

# One queue per category so that a marketing blast never sits in front of an OTP (docs/architecture.md, principle 4).
LANES = ("otp", "utility", "marketing")
# Maintenance has three queues, each with its own worker, so that no pass waits for another kind
# (issue 22): `maintenance`, the passes that only touch Postgres (lease recovery, lost releases,
# expiry, retention); `sync`, the passes that call out and can be as slow as what they call (status
# sync and instance poll ask Evolution, the ingestion reconciler forwards to our webhook); `bulk`,
# the dashboard's bulk force-resends, which can run for minutes.
MAINTENANCE_QUEUE = "maintenance"
SYNC_QUEUE = "sync"
BULK_QUEUE = "bulk"
# Status callbacks (issue 23): the relay pass that writes and hands out deliveries, and the deliveries
# themselves, on queues and a worker of their own (worker_callbacks): a slow receiver never holds a
# send or a maintenance pass. The pass has a queue apart from the deliveries it hands out: on one
# FIFO queue each tick waited behind up to a whole released batch (deliver.RELEASE_BATCH) and expired
# there, so no pass ran until the batch drained (chaos/findings.md 12).
CALLBACKS_QUEUE = "callbacks"
CALLBACKS_RELAY_QUEUE = "callbacks_relay"
DELIVER_CALLBACK_TASK = "callbacks.deliver"
SEND_TASK = "messaging.send_message"

_exchange = Exchange("pilot_status", type="direct", durable=True)
app.conf.task_queues = [
    Queue(name, _exchange, routing_key=name, durable=True)
    for name in (*LANES, MAINTENANCE_QUEUE, SYNC_QUEUE, BULK_QUEUE, CALLBACKS_QUEUE, CALLBACKS_RELAY_QUEUE)
]
app.conf.update(
    task_default_queue=MAINTENANCE_QUEUE,
    task_default_exchange="pilot_status",
    task_default_routing_key=MAINTENANCE_QUEUE,
)
# Send tasks are routed per message by the relay (lane_for); everything else here.
app.conf.task_routes = {
    "messaging.reconcile_messages": {"queue": MAINTENANCE_QUEUE},
    "messaging.prune_timelines": {"queue": MAINTENANCE_QUEUE},
    "ingestion.prune_inbox": {"queue": MAINTENANCE_QUEUE},
    "messaging.sync_statuses": {"queue": SYNC_QUEUE},
    "messaging.poll_instance_states": {"queue": SYNC_QUEUE},
    "ingestion.reconcile_events": {"queue": SYNC_QUEUE},
    "dashboard.run_bulk_resend": {"queue": BULK_QUEUE},
    "callbacks.relay": {"queue": CALLBACKS_RELAY_QUEUE},
    "callbacks.prune_deliveries": {"queue": MAINTENANCE_QUEUE},
    "messaging.govern_health": {"queue": MAINTENANCE_QUEUE},
    DELIVER_CALLBACK_TASK: {"queue": CALLBACKS_QUEUE},
}


def lane_for(category: str) -> str:
    """The queue a message of this category is sent through."""
    lane = category.lower()
    if lane not in LANES:
        raise ValueError(f"no lane for category {category!r}")
    return lane


# Read from the environment directly: touching django.conf.settings while this module is imported
# (from pilot_status/__init__) would load the settings module half-imported. The settings package
# validates the same variables (and documents them) at start-up.
def _period(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


def _entry(task: str, period: float) -> dict[str, Any]:
    # Each entry names its queue and expires: a tick that waited longer than its own period is stale,
    # and the next tick does the same work. django-celery-beat's DatabaseScheduler keeps only
    # `expire_seconds` of the options (its PeriodicTask column; `expires` is dropped when it writes
    # this entry to the table), and sends it to the worker as the task's `expires`.
    return {
        "task": task,
        "schedule": period,
        "options": {"queue": app.conf.task_routes[task]["queue"], "expire_seconds": max(1, int(period))},
    }


app.conf.beat_schedule = {
    "reconcile-messages": _entry("messaging.reconcile_messages", _period("RECONCILE_SECONDS", 10)),
    "sync-statuses": _entry("messaging.sync_statuses", _period("STATUS_SYNC_SECONDS", 60)),
    # Safety net for a lost connection.update: instances we think are down but hold messages.
    "poll-instance-states": _entry("messaging.poll_instance_states", _period("INSTANCE_POLL_SECONDS", 15)),
    "reconcile-ingestion": _entry("ingestion.reconcile_events", _period("INGESTION_RECONCILE_SECONDS", 300)),
    "prune-timelines": _entry("messaging.prune_timelines", _period("RETENTION_SECONDS", 600)),
    "prune-inbox": _entry("ingestion.prune_inbox", _period("RETENTION_SECONDS", 600)),
    "relay-callbacks": _entry("callbacks.relay", _period("CALLBACKS_RELAY_SECONDS", 1)),
    "prune-callbacks": _entry("callbacks.prune_deliveries", _period("RETENTION_SECONDS", 600)),
    # The health governor's judgement of what time moves: ends of rests, ramps, cooling periods; the shares.
    "govern-health": _entry("messaging.govern_health", _period("HEALTH_PASS_SECONDS", 30)),
}
BEAT_TASKS = frozenset(entry["task"] for entry in app.conf.beat_schedule.values())

# Celery's Django fixup closes the database connection before and after every task unless
# CELERY_DB_REUSE_MAX is set: opening a new Postgres backend per message took a sixth of a lane
# worker's time (bench B2 profile). Reuse it; Django's own rules still drop a connection that is
# too old, has seen an error, or fails its health check, before each task (below).
app.conf.CELERY_DB_REUSE_MAX = 10_000


@task_prerun.connect
def _drop_stale_connection(**kwargs: Any) -> None:
    from django.db import close_old_connections

    close_old_connections()


@task_postrun.connect
def _give_back_pooled_connection(**kwargs: Any) -> None:
    # A threads-pool lane worker shares a few connections among many threads (DATABASE_POOL_MAX_SIZE,
    # issue 26): a thread done with its task gives its connection back, or idle threads would hold the
    # whole pool. Without a pool (every other worker) nothing changes: the connection is reused.
    from pilot_status.database import release_while_waiting

    release_while_waiting()


@task_prerun.connect
def _start_heartbeat(task: Any = None, **kwargs: Any) -> None:
    if task is not None and task.name in BEAT_TASKS:
        task.request.ps_started = time.time()


@task_postrun.connect
def _record_heartbeat(task: Any = None, state: str | None = None, **kwargs: Any) -> None:
    # Every beat task leaves its last run in Redis (pilot_status.heartbeats): that it runs at all is
    # what an operator (and tests/pilot_status/test_beat.py) looks at first.
    if task is not None and task.name in BEAT_TASKS:
        from pilot_status import heartbeats

        request = task.request
        heartbeats.record(task.name, getattr(request, "ps_started", None), state or "", str(request.hostname or ""))


# This process's heartbeat (pilot_status.heartbeats), for a worker or beat: a daemon thread writes it
# every HEARTBEAT_SECONDS from the moment the worker is ready (beat: starts), named after what it serves
# (`worker:otp`, `beat`). A clean stop removes it; a killed worker turns stale on the status page.
@worker_ready.connect
def _start_worker_heartbeat(sender: Any = None, **kwargs: Any) -> None:
    from pilot_status import heartbeats

    queues = sorted(app.amqp.queues.consume_from or {})
    name = ",".join(queues) or str(getattr(sender, "hostname", "") or "").partition("@")[0] or "celery"
    heartbeats.beat_in_background(f"worker:{name}")


# A stop (SIGTERM: compose, honcho, a deploy) only sets a flag that the worker's event loop reads when its poll
# returns, and an idle worker's poll waits as long as its next timer allows, up to kombu's 10 s: an idle lane
# worker took ~10 s to stop. A timer every second bounds that wait, so a stop is seen within a second.
STOP_CHECK_SECONDS = 1.0


@worker_ready.connect
def _notice_a_stop_within_a_second(sender: Any = None, **kwargs: Any) -> None:
    hub = getattr(sender, "hub", None)  # the consumer's event loop (None under a pool without one)
    if hub is not None:
        hub.call_repeatedly(STOP_CHECK_SECONDS, _wake)


def _wake() -> None:
    """Nothing to do: the timer only makes the event loop's poll return, and the loop then reads the stop flag."""


# What starting the worker built lives as long as it: out of every later collection (pilot_status.collector). The
# threads pool runs its tasks in the process that is ready; a prefork pool's children fork before that, and each
# freezes its own once it is set up.
@worker_ready.connect
@worker_process_init.connect
def _freeze_startup_objects(**kwargs: Any) -> None:
    from pilot_status.collector import freeze_startup_objects

    freeze_startup_objects()


# One beat per database (pilot_status.beat_lock): a second beat exits here, before its heartbeat, with a
# message naming the one that holds the lock. Connected first: receivers run in the order they connect.
@beat_init.connect
def _hold_the_beat_lock(sender: Any = None, **kwargs: Any) -> None:
    from pilot_status import beat_lock

    try:
        beat_lock.hold_or_exit(sender)
    except Exception as exc:
        # Celery's signal dispatch logs a receiver's exception and goes on: a beat whose lock could not
        # be set up would run unguarded. Fail closed instead (SystemExit is not caught there).
        raise SystemExit(f"beat: the one-beat lock could not be set up ({exc!r}); exiting") from exc


@beat_init.connect
def _start_beat_heartbeat(sender: Any = None, **kwargs: Any) -> None:
    from pilot_status import heartbeats

    heartbeats.beat_in_background("beat")


@worker_process_shutdown.connect
def _send_waiting_counts(**kwargs: Any) -> None:
    # A pool process ends with os._exit, past atexit: its last counts (pilot_status.metrics) go now.
    from pilot_status import metrics

    metrics.flush()


app.autodiscover_tasks(["messaging", "messaging.sending", "ingestion", "dashboard", "callbacks"])
