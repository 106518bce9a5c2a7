"""Django admin for operations: every project, every instance, every message and dead letter."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from . import governor, resend
from .choices import HealthState
from .errors import Rejected
from .models import (
    ApiKey,
    DeadLetter,
    Instance,
    InstanceHealthEvent,
    Message,
    MessageEvent,
    OptIn,
    Project,
    SendSchedule,
)


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

    # Actions change rows: staff with only the view permission neither see nor run them (issue 21).
    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = sum(1 for key in queryset if key.revoke())
        self.message_user(request, f"Revoked {count} key(s).")


class InstanceHealthEventInline(admin.TabularInline):  # type: ignore[type-arg]
    """The number's health history, newest first: every change the governor or an operator made, and why."""

    model = InstanceHealthEvent
    extra = 0
    fields = ("at", "from_state", "to_state", "reason", "actor", "evidence", "cold_paused_until")
    readonly_fields = fields
    can_delete = False
    verbose_name = "health change"
    verbose_name_plural = "health history"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _override(state: str) -> Any:
    """An admin action that sets the selected numbers' health state (messaging.governor.override): it holds for
    HEALTH_OVERRIDE_SECONDS (a restriction until lifted) and is logged with the operator's username."""

    @admin.action(description=f"Set health: {HealthState(state).label}", permissions=["change"])
    def action(modeladmin: InstanceAdmin, request: HttpRequest, queryset: QuerySet[Instance]) -> None:
        moved: list[str] = []
        raced: list[str] = []
        for instance in queryset:
            event = governor.override(instance, state, request.user.get_username())
            (moved if event is not None else raced).append(instance.name)
        if moved:
            modeladmin.message_user(request, f"Health set to {state} for {len(moved)} instance(s): {', '.join(moved)}.")
        if raced:
            modeladmin.message_user(request, f"Not changed (the governor moved it meanwhile; try again): "
                                    f"{', '.join(raced)}.", level=messages.WARNING)

    action.__name__ = f"set_health_{state}"
    return action


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "name", "project", "is_official", "send_profile", "health_state", "priority", "connection_state", "circuit",
        "send_rate_per_second", "last_gateway_error", "state_changed_at",
    )
    list_filter = ("connection_state", "is_official", "send_profile", "health_state")
    search_fields = ("name",)
    # The health state moves only through the governor or an override action, each logged as a health change.
    readonly_fields = (
        "token_salt", "evolution_token_hash", "state_changed_at", "circuit", "last_gateway_error",
        "last_gateway_error_at", "sending_now", "honours_message_id", "health_state", "health_changed_at",
        "cold_paused_until", "health_override_until", "connection_reason",
    )
    actions = [_override(state) for state in HealthState.values]

    def get_inlines(self, request: HttpRequest, obj: Instance | None) -> list[Any]:
        return [InstanceHealthEventInline] if obj is not None else []  # a new number has no history

    @admin.display(description="sending now")
    def sending_now(self, obj: Instance) -> str:
        # The number's schedule under its policy (messaging.sending.slots; docs/sending-policy.md).
        schedule = SendSchedule.objects.filter(instance=obj).first()
        if schedule is None:
            return "no send yet"
        busy = f"one send in flight until {schedule.reserved_until:%H:%M:%S}" if schedule.reserved_by else "free"
        return (f"{busy}; next send from {schedule.next_send_at or '—'}; this hour {schedule.hour_sent}, today "
                f"{schedule.day_sent} ({schedule.day_cold} cold contacts); first send {schedule.first_send_at or '—'}")

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


def _actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "id", "project", "category", "to", "status", "failure_reason", "outcome_unknown", "attempts", "instance",
        "evolution_message_id", "created_at",
    )
    list_filter = ("status", "category", "failure_reason", "environment", "project")

    @admin.display(description="outcome unknown", boolean=True)
    def outcome_unknown(self, obj: Message) -> bool:
        return obj.outcome_unknown

    search_fields = ("=id", "to", "=evolution_message_id", "=own_message_id")
    search_help_text = "Message id, recipient (+E.164), Evolution message id or the WhatsApp id its sends carry"
    list_select_related = ("project", "instance")
    readonly_fields = [f.name for f in Message._meta.fields] + ["dead_letter_link"]
    inlines = [MessageEventInline]
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A view, never a form: saving one would write the whole row back, its status as read at the start of
        # the request over a move made meanwhile. A status changes only through messaging.lifecycle.
        return False

    @admin.display(description="dead letter")
    def dead_letter_link(self, obj: Message) -> str:
        entry = DeadLetter.objects.filter(message=obj).first()
        if entry is None:
            return "—"
        url = reverse("admin:messaging_deadletter_change", args=[entry.pk])
        return format_html('<a href="{}">#{} {}</a>', url, entry.pk, entry.get_status_display())


@admin.register(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "id", "project", "message_link", "recipient", "category", "reason", "outcome_unknown", "status", "attempts",
        "created_at", "resolved_by", "resolved_at",
    )
    list_filter = ("status", "reason", "message__category", "message__environment", "project", "created_at")
    search_fields = ("=id", "=message__id", "=message__to", "resolved_by")
    search_help_text = "Dead letter id, message id, recipient (+E.164) or who resolved it"
    list_select_related = ("project", "message")
    readonly_fields = (
        "message_link", "project", "reason", "detail", "last_gateway_response", "attempts", "status",
        "resolved_by", "resolved_at", "created_at",
    )
    exclude = ("message",)
    actions = ["force_resend", "force_resend_maybe_delivered", "dismiss"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="message")
    def message_link(self, obj: DeadLetter) -> str:
        url = reverse("admin:messaging_message_change", args=[obj.message_id])
        return format_html('<a href="{}">{}</a>', url, obj.message_id)

    @admin.display(description="recipient", ordering="message__to")
    def recipient(self, obj: DeadLetter) -> str:
        return obj.message.to

    @admin.display(description="category", ordering="message__category")
    def category(self, obj: DeadLetter) -> str:
        return obj.message.category

    # Actions change rows: staff with only the view permission neither see nor run them (issue 21).
    @admin.action(description="Force resend selected dead letters", permissions=["change"])
    def force_resend(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        self._act(request, queryset, lambda entry: resend.force_resend(entry, _actor(request)), "resent")

    @admin.action(
        description="Force resend selected, including those that may have been delivered (OUTCOME_UNKNOWN)",
        permissions=["change"],
    )
    def force_resend_maybe_delivered(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        # A separate action: the plain one refuses a message that may have been delivered
        # (confirmation_required), so sending one twice is always a deliberate choice.
        self._act(
            request, queryset,
            lambda entry: resend.force_resend(entry, _actor(request), confirm_maybe_delivered=True), "resent",
        )

    @admin.display(description="outcome unknown", boolean=True)
    def outcome_unknown(self, obj: DeadLetter) -> bool:
        return obj.message.outcome_unknown

    @admin.action(description="Dismiss selected dead letters", permissions=["change"])
    def dismiss(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        self._act(request, queryset, lambda entry: resend.dismiss(entry, _actor(request)), "dismissed")

    def _act(self, request: HttpRequest, queryset: QuerySet[DeadLetter], act: Any, verb: str) -> None:
        done = unchanged = 0
        refused: list[str] = []
        for entry in queryset.order_by("pk"):
            try:
                result = act(entry)
            except Rejected as exc:
                refused.append(f"#{entry.pk}: {exc.code}")
                continue
            if result.changed:
                done += 1
            else:
                unchanged += 1
        self.message_user(request, f"{done} {verb}, {unchanged} already handled.", messages.SUCCESS)
        if refused:
            self.message_user(request, f"{len(refused)} refused — " + "; ".join(refused[:20]), messages.WARNING)


@admin.register(MessageEvent)
class MessageEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The timeline across messages; filtered to RESENT it is the audit of who resent what."""

    list_display = ("created_at", "kind", "actor", "message_link", "project", "detail")
    list_filter = ("kind", "message__project")
    search_fields = ("=actor", "=message__id")
    search_help_text = "Actor (e.g. dashboard:bob, admin:ops, api:ps_live_…) or message id"
    list_select_related = ("message__project",)
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="message")
    def message_link(self, obj: MessageEvent) -> str:
        url = reverse("admin:messaging_message_change", args=[obj.message_id])
        return format_html('<a href="{}">{}</a>', url, obj.message_id)

    @admin.display(description="project")
    def project(self, obj: MessageEvent) -> Any:
        return obj.message.project


@admin.register(OptIn)
class OptInAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("phone", "project", "environment", "source", "created_at", "revoked_at", "revoked_source",
                    "revoked_reference")
    search_fields = ("phone",)
    list_filter = ("project", "environment", "revoked_source")
