"""Beat tasks of the messaging app: thin wrappers around one-pass functions."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from . import reconciler, status_sync
from .sending import instance_state


@shared_task(name="messaging.reconcile_messages", ignore_result=True)
def reconcile_messages() -> dict[str, Any]:
    return reconciler.run_batch().__dict__


@shared_task(name="messaging.sync_statuses", ignore_result=True)
def sync_statuses() -> int:
    return status_sync.run_batch()


@shared_task(name="messaging.poll_instance_states", ignore_result=True)
def poll_instance_states() -> int:
    return instance_state.poll_waiting()
