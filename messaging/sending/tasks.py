"""The lane task: thin, one id in, one unit of work (worker.send_one)."""

from __future__ import annotations

from celery import shared_task

from pilot_status.celery import SEND_TASK

from . import worker


@shared_task(name=SEND_TASK, acks_late=True, ignore_result=True)
def send_message(message_id: str) -> str:
    return worker.send_one(message_id)
