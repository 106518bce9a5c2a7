from __future__ import annotations

import json

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from . import handlers, inbox
from .models import IngestionEvent

# Every column but the raw payload, which is shown through `payload_at_rest` instead.
_SHOWN = [f.name for f in IngestionEvent._meta.fields if f.name != "payload"]


class ProcessedFilter(admin.SimpleListFilter):
    title = "processed"
    parameter_name = "processed"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:  # type: ignore[type-arg]
        return [("no", "Not processed"), ("yes", "Processed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[IngestionEvent]) -> QuerySet[IngestionEvent]:
        if self.value() == "no":
            return queryset.filter(processed_at__isnull=True)
        if self.value() == "yes":
            return queryset.filter(processed_at__isnull=False)
        return queryset


@admin.register(IngestionEvent)
class IngestionEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "event", "instance_name", "key_id", "channel", "received_at", "processed_at", "outcome")
    list_filter = (ProcessedFilter, "event", "channel", "outcome")
    search_fields = ("=dedup_key", "key_id", "instance_name")
    fields = (*_SHOWN, "payload_at_rest")
    readonly_fields = (*_SHOWN, "payload_at_rest")
    date_hierarchy = "received_at"
    actions = ["reprocess"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="payload")
    def payload_at_rest(self, event: IngestionEvent) -> str:
        # The stored payload holds no credential (inbox.at_rest; older rows were stripped by
        # migration 0006); stripped again here so that no path can show one.
        payload = inbox.at_rest(event.payload) if isinstance(event.payload, dict) else event.payload
        return format_html("<pre>{}</pre>", json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True))

    # Reprocessing changes rows: staff with only the view permission neither see nor run it (issue 21).
    @admin.action(description="Reprocess selected unprocessed events", permissions=["change"])
    def reprocess(self, request: HttpRequest, queryset: QuerySet[IngestionEvent]) -> None:
        # The same business logic both channels run (handlers.apply is idempotent and locks the
        # row), so reprocessing an event a channel is handling right now is harmless.
        outcomes: dict[str, int] = {}
        skipped = 0
        for event in queryset.order_by("received_at", "pk"):
            if event.processed_at is not None:
                skipped += 1
                continue
            outcome = handlers.apply(event)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        summary = ", ".join(f"{n} {word}" for word, n in sorted(outcomes.items())) or "nothing to reprocess"
        self.message_user(request, f"Reprocessed: {summary}; {skipped} already processed.", messages.SUCCESS)
