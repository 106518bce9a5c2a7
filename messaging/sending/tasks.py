"""The lane task: thin, one id in, one unit of work (worker.send_one)."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from pilot_status.celery import SEND_TASK

from .. import otp_window
from . import worker


@shared_task(name=SEND_TASK, acks_late=True, ignore_result=True, bind=True)
def send_message(self: Task[Any, Any], message_id: str) -> str:
    lane = str((self.request.delivery_info or {}).get("routing_key") or "")
    if otp_window.lane_waits(lane):
        otp_window.wait_for_window(f"send:{lane}")
    return worker.send_one(message_id)
