from django.apps import AppConfig


class IngestionConfig(AppConfig):
    name = "ingestion"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from messaging.models import Instance, MessageEvent
        from pilot_status import metrics

        from . import auth

        # Connects the early-receipt listener to messaging.lifecycle.message_sent.
        from . import handlers  # noqa: F401

        # ps:metrics:messages:* are counted from the timeline (pilot_status.metrics).
        post_save.connect(metrics.count_message_event, sender=MessageEvent, dispatch_uid="metrics.message_events")
        # A change made in this process (admin, operator command) reaches its own auth cache at once;
        # other processes see it within auth.AUTH_CACHE_SECONDS.
        post_save.connect(auth.on_instance_changed, sender=Instance, dispatch_uid="ingestion.auth_cache")
        post_delete.connect(auth.on_instance_changed, sender=Instance, dispatch_uid="ingestion.auth_cache")
