from __future__ import annotations

from celery import shared_task

from . import reconciler


@shared_task(name="ingestion.reconcile_events", ignore_result=True)
def reconcile_events() -> int:
    return reconciler.run_batch()
