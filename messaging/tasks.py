"""Beat tasks of the messaging app: thin wrappers around one-pass functions.

Each pass keeps to its own time budget (settings *_PASS_SECONDS); Celery's soft time limit (the
budget + 20 s) is the backstop for a call that hangs past it, and the next tick goes on.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from . import governor, reconciler, retention, status_sync
from .sending import instance_state

_RECONCILE_LIMIT = int(settings.RECONCILE_PASS_SECONDS) + 20
_SYNC_LIMIT = int(settings.STATUS_SYNC_PASS_SECONDS) + 20
_POLL_LIMIT = int(instance_state.POLL_BUDGET_SECONDS) + 20
_RETENTION_LIMIT = int(settings.RETENTION_PASS_SECONDS) + 20
_HEALTH_LIMIT = int(settings.HEALTH_PASS_SECONDS) + 20


@shared_task(name="messaging.reconcile_messages", ignore_result=True, soft_time_limit=_RECONCILE_LIMIT,
             time_limit=_RECONCILE_LIMIT + 10)
def reconcile_messages() -> dict[str, Any]:
    return reconciler.run_batch().__dict__


@shared_task(name="messaging.sync_statuses", ignore_result=True, soft_time_limit=_SYNC_LIMIT, time_limit=_SYNC_LIMIT + 10)
def sync_statuses() -> int:
    return status_sync.run_batch()


@shared_task(name="messaging.poll_instance_states", ignore_result=True, soft_time_limit=_POLL_LIMIT,
             time_limit=_POLL_LIMIT + 10)
def poll_instance_states() -> int:
    return instance_state.poll_waiting()


@shared_task(name="messaging.prune_timelines", ignore_result=True, soft_time_limit=_RETENTION_LIMIT,
             time_limit=_RETENTION_LIMIT + 10)
def prune_timelines() -> int:
    return retention.prune_timelines()


@shared_task(name="messaging.govern_health", ignore_result=True, soft_time_limit=_HEALTH_LIMIT,
             time_limit=_HEALTH_LIMIT + 10)
def govern_health() -> int:
    return governor.run_pass()
