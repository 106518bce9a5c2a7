from __future__ import annotations

from django.contrib import admin

from .models import IngestionEvent


@admin.register(IngestionEvent)
class IngestionEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "event", "instance_name", "key_id", "channel", "received_at", "processed_at", "outcome")
    list_filter = ("event", "channel", "outcome")
    search_fields = ("=dedup_key", "key_id", "instance_name")
    readonly_fields = [f.name for f in IngestionEvent._meta.fields]
    date_hierarchy = "received_at"
