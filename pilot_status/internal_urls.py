"""The webhook pool's URLs: the internal endpoints only (pilot_status.internal_wsgi)."""

from ingestion.urls import urlpatterns

__all__ = ["urlpatterns"]
