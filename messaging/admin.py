"""Django admin for operations: every project, every instance, every message and dead letter."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import ApiKey, DeadLetter, Instance, Message, MessageEvent, OptIn, Project


class ApiKeyInline(admin.TabularInline):  # type: ignore[type-arg]
    model = ApiKey
    extra = 0
    fields = ("display_prefix", "environment", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    can_delete = False


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "name", "production_approved", "test_number", "created_at")
    list_filter = ("production_approved",)
    search_fields = ("name",)
    filter_horizontal = ("members",)
    inlines = [ApiKeyInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("display_prefix", "project", "environment", "created_at", "last_used_at", "revoked_at")
    list_filter = ("environment",)
    readonly_fields = ("key_hash", "display_prefix", "created_at", "last_used_at")
    actions = ["revoke"]

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = sum(1 for key in queryset if key.revoke())
        self.message_user(request, f"Revoked {count} key(s).")


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "name", "project", "is_official", "priority", "connection_state", "circuit", "send_rate_per_second",
        "last_gateway_error", "state_changed_at",
    )
    list_filter = ("connection_state", "is_official")
    search_fields = ("name",)
    readonly_fields = (
        "token_salt", "evolution_token_hash", "state_changed_at", "circuit", "last_gateway_error",
        "last_gateway_error_at",
    )

    @admin.display(description="circuit")
    def circuit(self, obj: Instance) -> str:
        # The breaker's state lives in Redis (per process when Redis is down): see sending/breaker.py.
        from .sending import breaker

        return breaker.state_of(breaker.instance_scope(obj.name))


class MessageEventInline(admin.TabularInline):  # type: ignore[type-arg]
    model = MessageEvent
    extra = 0
    fields = ("created_at", "kind", "actor", "detail")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "project", "category", "to", "status", "failure_reason", "attempts", "instance", "created_at")
    list_filter = ("status", "category", "failure_reason", "environment")
    search_fields = ("=id", "to", "=evolution_message_id")
    list_select_related = ("project", "instance")
    readonly_fields = [f.name for f in Message._meta.fields]
    inlines = [MessageEventInline]
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "project", "message", "reason", "status", "attempts", "created_at", "resolved_by")
    list_filter = ("status", "reason")
    search_fields = ("=message__id", "message__to")
    list_select_related = ("project", "message")
    readonly_fields = ("message", "project", "reason", "detail", "last_gateway_response", "attempts", "created_at")


@admin.register(OptIn)
class OptInAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("phone", "project", "source", "created_at", "revoked_at")
    search_fields = ("phone",)
    list_filter = ("project",)
