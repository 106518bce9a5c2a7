from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"

    def ready(self) -> None:
        # Registers the bulk-resend task with Celery (pilot_status.celery autodiscovers only
        # messaging and ingestion).
        from . import tasks  # noqa: F401
