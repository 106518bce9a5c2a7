"""The background side of bulk resend: thin, the work is in dashboard.bulk."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction

from pilot_status.celery import BULK_QUEUE

from . import bulk

log = logging.getLogger(__name__)
TASK = "dashboard.run_bulk_resend"


@shared_task(name=TASK)
def run_bulk_resend(job_id: int) -> None:
    if bulk.run(job_id):
        # More remains: a fresh task (no countdown), so other bulk jobs get a turn.
        enqueue(job_id)


def enqueue(job_id: int) -> None:
    try:
        run_bulk_resend.apply_async(args=(job_id,), queue=BULK_QUEUE)
    except Exception:  # the broker is down: the job row waits; opening its page kicks it again
        log.exception("could not enqueue bulk resend %s", job_id)


def enqueue_on_commit(job_id: int) -> None:
    transaction.on_commit(lambda: enqueue(job_id))
