from django.apps import AppConfig


class IngestionConfig(AppConfig):
    name = "ingestion"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from messaging.models import MessageEvent
        from pilot_status import metrics

        # Connects the early-receipt listener to messaging.lifecycle.message_sent.
        from . import handlers  # noqa: F401

        # ps:metrics:messages:* are counted from the timeline (pilot_status.metrics).
        post_save.connect(metrics.count_message_event, sender=MessageEvent, dispatch_uid="metrics.message_events")
