from django.db import models


class BaselineRow(models.Model):
    """One row per baseline request: the least a real write endpoint can do."""

    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
