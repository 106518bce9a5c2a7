from django.apps import AppConfig


class CallbacksConfig(AppConfig):
    """Status callbacks (issue 23): a project's webhook endpoints and the deliveries to them."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "callbacks"
