"""A project's webhook endpoints and its replays: the one way in for the API and the dashboard.

Every refusal is a messaging.errors.Rejected (the API's error envelope) and changes nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from messaging.errors import Rejected
from messaging.models import Project

from . import addresses
from .models import Circuit, Delivery, DeliveryStatus, WebhookEndpoint, new_secret


def for_project(project: Project) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(project=project)


def check_url(url: str) -> None:
    """Refuse a URL that may not be called (length, shape, addresses), as the API's 422."""
    if len(url) > settings.CALLBACKS_MAX_URL_LENGTH:
        raise Rejected(400, "invalid_request", "The URL is too long.", {"maxLength": settings.CALLBACKS_MAX_URL_LENGTH})
    try:
        addresses.check(url)
    except addresses.Refused as refused:
        raise Rejected(422, refused.code, refused.message, {"url": url}) from refused


def create(project: Project, url: str, event_types: list[str], description: str = "") -> WebhookEndpoint:
    check_url(url)
    with transaction.atomic():
        # The project's row is the lock: two creations at once cannot both pass the count.
        Project.objects.select_for_update().filter(pk=project.pk).first()
        if for_project(project).filter(per_message=False).count() >= settings.CALLBACKS_MAX_ENDPOINTS_PER_PROJECT:
            raise Rejected(
                409, "too_many_endpoints", "This project has as many webhook endpoints as it may have.",
                {"limit": settings.CALLBACKS_MAX_ENDPOINTS_PER_PROJECT},
            )
        return WebhookEndpoint.objects.create(project=project, url=url, event_types=sorted(set(event_types)), description=description)


def update(endpoint: WebhookEndpoint, changes: dict[str, Any]) -> WebhookEndpoint:
    """`url`, `eventTypes`, `description`, `enabled`. Enabling a disabled endpoint closes its circuit
    and forgets its failing run: its pending deliveries go on from where they were."""
    fields = ["updated_at"]
    if endpoint.per_message and ({"url", "eventTypes"} & set(changes)):
        raise Rejected(
            400, "invalid_request", "The per-message endpoint takes each send's callbackUrl; its URL and event types are fixed.",
            {"fields": {name: ["Fixed for the per-message endpoint."] for name in sorted({"url", "eventTypes"} & set(changes))}},
        )
    if "url" in changes:
        check_url(changes["url"])
        endpoint.url = changes["url"]
        fields.append("url")
    if "eventTypes" in changes:
        endpoint.event_types = sorted(set(changes["eventTypes"]))
        fields.append("event_types")
    if "description" in changes:
        endpoint.description = changes["description"]
        fields.append("description")
    if "enabled" in changes and changes["enabled"] != endpoint.enabled:
        endpoint.enabled = changes["enabled"]
        if endpoint.enabled:
            endpoint.disabled_reason, endpoint.disabled_at = "", None
            endpoint.circuit_state, endpoint.circuit_failures, endpoint.circuit_retry_at = Circuit.CLOSED, 0, None
            endpoint.failing_since = None
        else:
            endpoint.disabled_reason, endpoint.disabled_at = "Disabled through the API.", timezone.now()
        fields += ["enabled", "disabled_reason", "disabled_at", "circuit_state", "circuit_failures", "circuit_retry_at", "failing_since"]
    endpoint.save(update_fields=fields)
    return endpoint


def rotate_secret(endpoint: WebhookEndpoint) -> WebhookEndpoint:
    """A new secret for every attempt from now on (an attempt already signing keeps the old one)."""
    endpoint.secret = new_secret()
    endpoint.save(update_fields=["secret", "updated_at"])
    return endpoint


def delete(endpoint: WebhookEndpoint) -> None:
    endpoint.delete()  # its deliveries and attempts go with it (CASCADE)


def _refuse_disabled(endpoint: WebhookEndpoint) -> None:
    if not endpoint.enabled:
        raise Rejected(409, "endpoint_disabled", "The endpoint is disabled; enable it first.", {"endpointId": str(endpoint.pk)})


def replay(delivery: Delivery) -> Delivery:
    """Deliver again, with a fresh retry schedule and the same webhook-id (a receiver that has it
    already drops the copy)."""
    _refuse_disabled(delivery.endpoint)
    Delivery.objects.filter(pk=delivery.pk).update(
        status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=timezone.now(), claim_token=None
    )
    delivery.refresh_from_db()
    return delivery


def replay_failed(endpoint: WebhookEndpoint, since: datetime) -> int:
    _refuse_disabled(endpoint)
    return Delivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.FAILED, created_at__gte=since).update(
        status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=timezone.now(), claim_token=None
    )
