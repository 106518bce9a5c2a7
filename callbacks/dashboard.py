"""The dashboard's webhooks page: a member sees the project's endpoints (a disabled one says why and
since when), their recent deliveries with every attempt, and replays one delivery or every failed one
since a time. Membership is the permission (another project's page is 404); the page shows the dashboard
mode's environment only (dashboard.environments: the other environment's endpoints and deliveries are 404);
actions are POST-only and call callbacks.endpoints, as the API does."""

from __future__ import annotations

from datetime import timedelta
from datetime import timezone as dt_timezone

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_POST

from dashboard import environments
from dashboard.environments import shown_mode_only
from messaging.errors import Rejected
from messaging.models import Project

from . import endpoints
from .models import Delivery, DeliveryAttempt, DeliveryStatus

DELIVERIES_SHOWN = 20
ATTEMPTS_SHOWN = 5


def _project(request: HttpRequest, project_id: int) -> Project:
    return get_object_or_404(Project, pk=project_id, members=request.user)


@login_required
@require_GET
def webhooks(request: HttpRequest, project_id: int) -> HttpResponse:
    project = _project(request, project_id)
    environment = environments.current(request)
    rows = []
    for endpoint in endpoints.for_scope(project, environment).order_by("created_at", "pk"):
        deliveries = list(Delivery.objects.filter(endpoint=endpoint).order_by("-created_at", "-pk")[:DELIVERIES_SHOWN])
        attempts: dict[object, list[DeliveryAttempt]] = {d.pk: [] for d in deliveries}
        for attempt in DeliveryAttempt.objects.filter(delivery__in=[d.pk for d in deliveries]).order_by("-attempted_at", "-pk")[
            : ATTEMPTS_SHOWN * max(1, len(deliveries))
        ]:
            if len(attempts[attempt.delivery_id]) < ATTEMPTS_SHOWN:
                attempts[attempt.delivery_id].append(attempt)
        rows.append(
            {
                "endpoint": endpoint,
                "deliveries": [(d, attempts[d.pk]) for d in deliveries],
                "failed": Delivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.FAILED).count(),
            }
        )
    projects = list(request.user.projects.order_by("name"))  # type: ignore[union-attr]
    since = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    return render(
        request, "callbacks/webhooks.html",
        {"project": project, "projects": projects, "section": "webhooks", "rows": rows, "since": since,
         "environment": environment},
    )


@login_required
@require_POST
@shown_mode_only
def replay_one(request: HttpRequest, project_id: int, delivery_id: str) -> HttpResponse:
    project = _project(request, project_id)
    scoped = endpoints.deliveries_for_scope(project, environments.current(request))
    delivery = get_object_or_404(scoped.select_related("endpoint"), pk=delivery_id)
    try:
        endpoints.replay(delivery)
    except Rejected as refused:
        messages.error(request, f"Not replayed: {refused.message}")
    else:
        messages.success(request, "Replayed: the delivery is pending again, with a fresh set of attempts.")
    return redirect("callbacks-webhooks", project_id=project.pk)


@login_required
@require_POST
@shown_mode_only
def replay_failed(request: HttpRequest, project_id: int, endpoint_id: str) -> HttpResponse:
    project = _project(request, project_id)
    endpoint = get_object_or_404(endpoints.for_scope(project, environments.current(request)), pk=endpoint_id)
    raw = request.POST.get("since", "")[:40]
    since = parse_datetime(raw) if raw else None
    if since is None:
        messages.error(request, "Not replayed: give the time from which failed deliveries are replayed.")
        return redirect("callbacks-webhooks", project_id=project.pk)
    if timezone.is_naive(since):
        since = since.replace(tzinfo=dt_timezone.utc)  # the form says UTC
    try:
        count = endpoints.replay_failed(endpoint, since)
    except Rejected as refused:
        messages.error(request, f"Not replayed: {refused.message}")
    else:
        messages.success(request, f"Replayed {count} failed deliveries.")
    return redirect("callbacks-webhooks", project_id=project.pk)
