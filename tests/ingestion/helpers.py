"""Builders shared by the ingestion tests: Evolution payloads and a sent message."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.test import Client
from django.utils import timezone

from messaging.models import Instance, Message, Status
from pilot_status import metrics

SAMPLES = Path(__file__).resolve().parents[1] / "messaging" / "samples"
URL = "/api/internal/webhook"
KEY_ID = "3EB0C431C26A1916E07A4B"


def sample(name: str, instance: str = "alice-main", **data: Any) -> dict[str, Any]:
    payload = json.loads((SAMPLES / name).read_text())
    payload["instance"] = instance
    payload["data"].update(data)
    return payload


def receipt(status: str, key_id: str = KEY_ID, instance: str = "alice-main", channel: str = "webhook") -> dict[str, Any]:
    """A messages.update as Evolution sends it on `channel` (RabbitMQ: no destination)."""
    payload = sample("webhook.messages.update.DELIVERY_ACK.json", instance, status=status, keyId=key_id)
    if channel == "rabbitmq":
        payload.pop("destination", None)
        payload["date_time"] = "2025-10-21T11:41:14.530Z"  # stamped per channel
    return payload


def rabbit_copy(payload: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(payload)
    body.pop("destination", None)
    body["date_time"] = "2099-01-01T00:00:00.001Z"
    return body


def post(payload: Any, path: str = URL, **headers: Any) -> Any:
    return Client().post(path, data=json.dumps(payload), content_type="application/json", **headers)


def token_header(instance: Instance) -> dict[str, str]:
    return {"HTTP_X_WEBHOOK_TOKEN": instance.webhook_token}


def counter(name: str) -> int:
    return int(metrics.redis().get(metrics.EVOLUTION + name) or 0)


def make_message(project: Any, instance: Instance, status: str = Status.SENT, key_id: str = KEY_ID,
                 category: str = "UTILITY") -> Message:
    return Message.objects.create(
        project=project, environment="LIVE", category=category, to="+5511999999999", template="hi", text="hi",
        instance=instance, deliver_until=timezone.now() + timedelta(hours=1), status=status,
        sent_at=timezone.now() if status != Status.SENDING else None,
        evolution_message_id=key_id if status != Status.SENDING else "",
    )


class Clock:
    """A monotonic clock that moves only when a test sets `now`."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
