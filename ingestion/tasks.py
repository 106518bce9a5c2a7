from __future__ import annotations

from celery import shared_task
from django.conf import settings

from . import reconciler, retention

# The passes keep to their own budgets; the soft limits are the backstop for a call that hangs.
_RECONCILE_LIMIT = int(reconciler.DEADLINE_SECONDS) + 30
_RETENTION_LIMIT = int(settings.RETENTION_PASS_SECONDS) + 20


@shared_task(name="ingestion.reconcile_events", ignore_result=True, soft_time_limit=_RECONCILE_LIMIT,
             time_limit=_RECONCILE_LIMIT + 10)
def reconcile_events() -> int:
    return reconciler.run_batch()


@shared_task(name="ingestion.prune_inbox", ignore_result=True, soft_time_limit=_RETENTION_LIMIT,
             time_limit=_RETENTION_LIMIT + 10)
def prune_inbox() -> int:
    return retention.prune_inbox()
