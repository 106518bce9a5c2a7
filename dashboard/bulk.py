"""Bulk resend: start a job from a selection or a filter, then work through it chunk by chunk.

`process_chunk` is one unit of work: it locks the job row, resends the next chunk through
messaging.resend, and moves the cursor and the counters in the same transaction. A task that
dies mid-chunk rolls the whole chunk back, and running a chunk twice finds nothing to redo.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Max, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from messaging import resend
from messaging.models import DeadLetter, DeadLetterStatus, Project

from .models import BulkResendJob, BulkStatus

log = logging.getLogger(__name__)

CHUNK = 50
# One task run works this long, then hands the rest to a fresh task, so that a big job never
# holds the bulk worker away from the other jobs for minutes.
TASK_BUDGET_SECONDS = 10.0


def _stored_filters(filters: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in filters.items() if v}


def _loaded_filters(stored: dict[str, Any]) -> dict[str, Any]:
    loaded = dict(stored)
    for key in ("created_after", "created_before"):
        if loaded.get(key):
            loaded[key] = parse_datetime(loaded[key])
    return loaded


def _selection(job: BulkResendJob) -> QuerySet[DeadLetter]:
    """The job's open entries, of its own project and environment only (ticked ids of others are not part of it)."""
    rows: QuerySet[DeadLetter]
    if job.dead_letter_ids is not None:
        rows = DeadLetter.objects.for_scope(job.project, job.environment).filter(pk__in=job.dead_letter_ids)
    else:
        rows = resend.matching(job.project, job.environment, _loaded_filters(job.filters))
    # Only open entries can be resent; the filter's own status (if any) narrows further.
    return rows.filter(status=DeadLetterStatus.OPEN, pk__lte=job.max_dead_letter_id)


def start(project: Project, user: Any, actor: str, *, environment: str, ids: list[int] | None = None,
          filters: dict[str, Any] | None = None) -> BulkResendJob:
    """Create the job row (the caller enqueues the task on commit)."""
    job = BulkResendJob(
        project=project,
        environment=environment,
        created_by=user,
        actor=actor,
        dead_letter_ids=sorted(set(ids)) if ids is not None else None,
        filters=_stored_filters(filters or {}),
    )
    top = DeadLetter.objects.filter(project=project).aggregate(top=Max("pk"))["top"] or 0
    job.max_dead_letter_id = top
    job.total = _selection(job).count()
    if job.total == 0:
        job.status = BulkStatus.DONE
        job.finished_at = timezone.now()
    job.save()
    return job


def process_chunk(job_id: int, size: int = CHUNK) -> bool:
    """Resend the next chunk of a job; False when there was nothing left to do."""
    now = timezone.now()
    with transaction.atomic():
        job = (
            BulkResendJob.objects.select_for_update()
            .select_related("project")
            .filter(pk=job_id, status__in=[BulkStatus.PENDING, BulkStatus.RUNNING])
            .first()
        )
        if job is None:
            return False
        chunk = list(_selection(job).filter(pk__gt=job.cursor).order_by("pk")[:size])
        if job.started_at is None:
            job.started_at = now
        if not chunk:
            job.status = BulkStatus.DONE
            job.finished_at = now
            # Entries resolved by someone else while the job ran were never reached.
            job.skipped += max(0, job.total - job.processed)
            job.save()
            return False
        tally = resend.resend_each(chunk, job.actor)
        job.status = BulkStatus.RUNNING
        job.cursor = tally.last_id
        job.resent += tally.resent
        job.refused += tally.refused
        job.skipped += tally.skipped
        job.save()
    return True


def run(job_id: int, budget_seconds: float = TASK_BUDGET_SECONDS) -> bool:
    """Work on a job for a while; True when work remains (the caller hands it on)."""
    deadline = time.monotonic() + budget_seconds
    while process_chunk(job_id):
        if time.monotonic() >= deadline:
            return True
    return False


STALLED_AFTER = timedelta(seconds=60)


def stalled(job: BulkResendJob) -> bool:
    """A job whose task was lost (broker down at enqueue, worker gone): enqueue it again.

    Safe even when the task is only slow: chunks lock the job row, so two tasks take turns.
    """
    return job.status != BulkStatus.DONE and timezone.now() - job.updated_at > STALLED_AFTER


def progress(job: BulkResendJob) -> dict[str, Any]:
    return {
        "id": job.pk,
        "status": job.status,
        "statusLabel": job.get_status_display(),
        "total": job.total,
        "processed": job.processed,
        "resent": job.resent,
        "refused": job.refused,
        "skipped": job.skipped,
        "percent": job.percent,
        "done": job.status == BulkStatus.DONE,
    }
