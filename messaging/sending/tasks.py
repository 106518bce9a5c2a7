"""The lane task: thin, one id in, one unit of work (worker.send_one)."""

from __future__ import annotations

import random
from typing import Any

from celery import Task, shared_task

from pilot_status.celery import SEND_TASK

from . import worker


# max_retries=None: a claim that cannot be made now goes back to its queue as often as it takes (the message's
# deliverUntil ends the tries: an expired message is nothing to claim). Celery reads retry(max_retries=None) as
# "the task's own limit", so the limit is the task's.
@shared_task(name=SEND_TASK, acks_late=True, ignore_result=True, bind=True, max_retries=None)
def send_message(self: Task[Any, Any], message_id: str) -> str:
    try:
        return worker.send_one(message_id)
    except worker.ClaimNotNow:
        # No free pooled connection, or the row held past the lock timeout: nothing changed yet, and the task
        # goes back to its queue for another try in a moment, instead of leaving the message to the
        # reconciler's lost-release pass (a minute, ten for marketing). The due time stays Postgres's
        # (architecture principle 2): the message is still QUEUED and released, and that pass releases it again should
        # this retry be lost; putting the outbox row back instead would need the very connection the pool
        # could not give.
        raise back_to_queue(self)


def back_to_queue(task: Task[Any, Any]) -> Exception:
    """The task again in a moment, nothing changed meanwhile (Celery's retry, spread so a crowd does not return at once)."""
    return task.retry(countdown=RETRY_AFTER_SECONDS * (1 + random.random()))


# How soon a task that could not claim now is tried again (then up to twice that).
RETRY_AFTER_SECONDS = 1.0
