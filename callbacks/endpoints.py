"""A project's webhook endpoints and its replays: the one way in for the API and the dashboard.

An endpoint belongs to one environment, the key's that made it (the dashboard's mode): only that
environment's keys see it, and it receives only that environment's events (the sandbox rule,
docs/security.md). Every refusal is a messaging.errors.Rejected (the API's error envelope) and changes
nothing.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from messaging.api.throttling import take_token
from messaging.errors import Rejected
from messaging.models import Project

from . import addresses
from .models import Circuit, Delivery, DeliveryStatus, WebhookEndpoint, new_secret


def for_scope(project: Project, environment: str) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(project=project, environment=environment)


def deliveries_for_scope(project: Project, environment: str) -> QuerySet[Delivery]:
    return Delivery.objects.filter(endpoint__project=project, endpoint__environment=environment)


def check_url(url: str, project_id: Any) -> None:
    """Refuse a URL that may not be called (length, shape, port, addresses), as the API's 422: an
    endpoint's at registration, a send's callbackUrl at accept. With CALLBACKS_ALLOW_PRIVATE_ADDRESSES
    (development, the test stacks) only its shape: each attempt resolves it anyway."""
    if len(url) > settings.CALLBACKS_MAX_URL_LENGTH:
        raise Rejected(400, "invalid_request", "The URL is too long.", {"maxLength": settings.CALLBACKS_MAX_URL_LENGTH})
    try:
        if settings.CALLBACKS_ALLOW_PRIVATE_ADDRESSES:
            addresses.parse(url)
        else:
            addresses.check(url, owner=str(project_id))
    except addresses.Refused as refused:
        raise Rejected(422, refused.code, refused.message, {"url": url, **refused.details}) from refused


def create(
    project: Project, environment: str, url: str, event_types: list[str], description: str = ""
) -> WebhookEndpoint:
    # Counted before the host is looked up (a full project asks no name server), and again under the lock.
    _refuse_when_full(project, environment)
    check_url(url, project.pk)
    with transaction.atomic():
        # The project's row is the lock: two creations at once cannot both pass the count.
        Project.objects.select_for_update().filter(pk=project.pk).first()
        _refuse_when_full(project, environment)
        return WebhookEndpoint.objects.create(
            project=project, environment=environment, url=url, event_types=sorted(set(event_types)),
            description=description,
        )


def _refuse_when_full(project: Project, environment: str) -> None:
    # Counted per environment: a project's TEST endpoints never use up its LIVE world's room.
    registered = for_scope(project, environment).filter(per_message=False).count()
    if registered >= settings.CALLBACKS_MAX_ENDPOINTS_PER_PROJECT:
        raise Rejected(
            409, "too_many_endpoints", "This project has as many webhook endpoints as it may have.",
            {"limit": settings.CALLBACKS_MAX_ENDPOINTS_PER_PROJECT},
        )


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
        check_url(changes["url"], endpoint.project_id)
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
    endpoint.save(update_fields=["encrypted_secret", "updated_at"])
    return endpoint


def delete(endpoint: WebhookEndpoint) -> None:
    endpoint.delete()  # its deliveries and attempts go with it (CASCADE)


def _refuse_disabled(endpoint: WebhookEndpoint) -> None:
    if not endpoint.enabled:
        raise Rejected(409, "endpoint_disabled", "The endpoint is disabled; enable it first.", {"endpointId": str(endpoint.pk)})


def _take_replay(endpoint: WebhookEndpoint) -> None:
    """A replay sends the endpoint's deliveries out again, so replays are paced per endpoint (Redis's
    token bucket, shared by every web process): a tenant cannot turn them into a stream of requests
    at someone else's server."""
    per_minute = settings.CALLBACKS_REPLAYS_PER_MINUTE
    allowed, wait = take_token(f"replay:{endpoint.pk}", per_minute / 60, per_minute, lease_seconds=0)
    if not allowed:
        seconds = max(1, math.ceil(wait))
        raise Rejected(429, "rate_limited", "Too many replays for this endpoint; retry after the Retry-After seconds.",
                       {"endpointId": str(endpoint.pk), "replaysPerMinute": per_minute, "retryAfter": seconds},
                       retry_after=seconds)


def replay(delivery: Delivery) -> Delivery:
    """Deliver again, with a fresh retry schedule and the same webhook-id (a receiver that has it
    already drops the copy)."""
    _refuse_disabled(delivery.endpoint)
    _take_replay(delivery.endpoint)
    Delivery.objects.filter(pk=delivery.pk).update(
        status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=timezone.now(), claim_token=None
    )
    delivery.refresh_from_db()
    return delivery


def replay_failed(endpoint: WebhookEndpoint, since: datetime) -> int:
    _refuse_disabled(endpoint)
    _take_replay(endpoint)
    return Delivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.FAILED, created_at__gte=since).update(
        status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=timezone.now(), claim_token=None
    )
