"""The internal endpoints, spliced at the root of both URL confs (pilot_status.urls, internal_urls):
one level of resolution for every webhook, no include()."""

from django.urls import path, re_path

from pilot_status import status

from . import views

urlpatterns = [
    # allows POST /api/internal/webhook and Evolution's by-events form /api/internal/webhook/<event>
    path("api/internal/webhook", views.webhook, name="evolution-webhook"),
    re_path(r"^api/internal/webhook/(?P<event_suffix>[a-z0-9-]+)/?$", views.webhook),
    # allows GET /api/internal/metrics (JSON) and /api/internal/metrics/prometheus (text);
    # both need the x-internal-webhook-secret header.
    path("api/internal/metrics", views.metrics_json, name="internal-metrics"),
    path("api/internal/metrics/prometheus", views.metrics_prometheus, name="internal-metrics-prometheus"),
    # allows GET /api/internal/status: the operators' JSON status page (pilot_status/status.py);
    # Authorization: Bearer <OPS_STATUS_TOKEN>, or the internal secret.
    path("api/internal/status", status.status, name="internal-status"),
]
