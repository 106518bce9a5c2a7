"""The webhook pool's URLs: the internal endpoints only (pilot_status.internal_wsgi)."""

from django.urls import include, path

urlpatterns = [path("api/internal/", include("ingestion.urls"))]
