from django.apps import AppConfig


class IngestionConfig(AppConfig):
    name = "ingestion"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the early-receipt listener to messaging.lifecycle.message_sent.
        from . import handlers  # noqa: F401
