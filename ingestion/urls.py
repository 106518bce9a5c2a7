"""The internal endpoints, under /api/internal/ in both apps (pilot_status.urls, internal_urls)."""

from django.urls import path, re_path

from . import views

urlpatterns = [
    # allows POST /api/internal/webhook and Evolution's by-events form /api/internal/webhook/<event>
    path("webhook", views.webhook, name="evolution-webhook"),
    re_path(r"^webhook/(?P<event_suffix>[a-z0-9-]+)/?$", views.webhook),
    # allows GET /api/internal/metrics (JSON) and /api/internal/metrics/prometheus (text);
    # both need the x-internal-webhook-secret header.
    path("metrics", views.metrics_json, name="internal-metrics"),
    path("metrics/prometheus", views.metrics_prometheus, name="internal-metrics-prometheus"),
]
