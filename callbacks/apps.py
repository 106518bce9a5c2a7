from django.apps import AppConfig


class CallbacksConfig(AppConfig):
    """Status callbacks (issue 23): a project's webhook endpoints and the deliveries to them."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "callbacks"

    def ready(self) -> None:
        from messaging import callback_urls

        from .endpoints import check_url

        callback_urls.register(check_url)  # a send's callbackUrl is checked at accept (messaging.callback_urls)
