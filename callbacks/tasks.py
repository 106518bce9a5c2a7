"""The `callbacks` queue's two tasks, thin wrappers around callbacks.derive and callbacks.deliver."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from pilot_status.celery import CALLBACKS_QUEUE, DELIVER_CALLBACK_TASK

from . import deliver, derive, retention

_RELAY_BUDGET = max(0.5, min(5.0, settings.CALLBACKS_RELAY_SECONDS * 2))
# A prefork worker's backstop; the threads pool ignores it, and callbacks.http's deadline is what ends an attempt.
_DELIVER_LIMIT = int(settings.CALLBACKS_RESOLVE_SECONDS + settings.CALLBACKS_ATTEMPT_SECONDS) + 30


@shared_task(name="callbacks.relay", ignore_result=True, soft_time_limit=30, time_limit=40)
def relay() -> dict[str, Any]:
    """Beat, every CALLBACKS_RELAY_SECONDS: write the deliveries owed, then hand the due ones out."""
    derived = derive.run(_RELAY_BUDGET)
    released = deliver.release_due(_publish)
    return {**derived.__dict__, "released": released}


def _publish(delivery_id: str, token: str) -> None:
    deliver_callback.apply_async((delivery_id, token), queue=CALLBACKS_QUEUE, routing_key=CALLBACKS_QUEUE)


@shared_task(name=DELIVER_CALLBACK_TASK, ignore_result=True, soft_time_limit=_DELIVER_LIMIT, time_limit=_DELIVER_LIMIT + 10)
def deliver_callback(delivery_id: str, token: str) -> str:
    return deliver.attempt(delivery_id, token).done


_RETENTION_LIMIT = int(settings.RETENTION_PASS_SECONDS) + 20


@shared_task(name="callbacks.prune_deliveries", ignore_result=True, soft_time_limit=_RETENTION_LIMIT,
             time_limit=_RETENTION_LIMIT + 10)
def prune_deliveries() -> int:
    return retention.prune_deliveries()
