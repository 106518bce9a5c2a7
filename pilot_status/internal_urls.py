"""The webhook pool's URLs: the internal endpoints and the probes only (pilot_status.internal_wsgi)."""

from django.urls import path

from ingestion.urls import urlpatterns as internal_urlpatterns

from . import health, scrape

urlpatterns = [
    # The web pool answers these in pilot_status.health.ProbeMiddleware; this pool has no host check
    # or redirect to skip, so plain routes do.
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # allows GET /metrics: Prometheus's scrape, Authorization: Bearer <METRICS_TOKEN> (pilot_status/scrape.py)
    path("metrics", scrape.scrape, name="metrics"),
    *internal_urlpatterns,
]
