from django.apps import AppConfig


class BaselineConfig(AppConfig):
    name = "bench.baseline"
    label = "bench_baseline"
    default_auto_field = "django.db.models.BigAutoField"
