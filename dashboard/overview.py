"""What the overview page shows: today's traffic by lane and status, instances, open dead letters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time
from datetime import timezone as dt_timezone
from typing import Any

from django.db.models import Count
from django.utils import timezone

from messaging import health, unacknowledged
from messaging.models import (
    Category,
    DeadLetter,
    DeadLetterStatus,
    Instance,
    InstanceHealthEvent,
    Message,
    Project,
    Status,
)


@dataclass
class LaneRow:
    lane: str
    label: str
    counts: list[int]
    total: int


def start_of_today(now: datetime | None = None) -> datetime:
    now = now or timezone.now()
    return datetime.combine(now.astimezone(dt_timezone.utc).date(), time.min, tzinfo=dt_timezone.utc)


@dataclass
class Today:
    statuses: list[str]
    lanes: list[LaneRow]
    totals: list[int]
    by_status: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.totals)

    @property
    def delivered(self) -> int:
        return self.by_status[Status.DELIVERED] + self.by_status[Status.READ]

    @property
    def in_flight(self) -> int:
        return sum(self.by_status[s] for s in (Status.QUEUED, Status.SENDING, Status.SENT, Status.SERVER_ACK))

    @property
    def failed(self) -> int:
        return self.by_status[Status.FAILED]


def today_by_lane(project: Project, environment: str, now: datetime | None = None) -> Today:
    """One row per lane, one column per status, for the environment's messages created today (UTC)."""
    # Served by the (project, environment, -created_at) index on messaging_message.
    rows = (
        Message.objects.for_scope(project, environment)
        .filter(created_at__gte=start_of_today(now))
        .values("category", "status")
        .annotate(n=Count("id"))
    )
    counts = {(r["category"], r["status"]): r["n"] for r in rows}
    statuses = list(Status.values)
    lanes = [
        LaneRow(c.value, c.label, [counts.get((c.value, s), 0) for s in statuses], 0) for c in Category
    ]
    for lane in lanes:
        lane.total = sum(lane.counts)
    totals = [sum(lane.counts[i] for lane in lanes) for i in range(len(statuses))]
    return Today([Status(s).label for s in statuses], lanes, totals, dict(zip(statuses, totals)))


def instances(project: Project) -> list[Instance]:
    """The project's instances, each with `unacknowledged` (its recent sends WhatsApp never acknowledged) and
    `health_change` (the last change of its health state, the evidence for the state shown; None: never changed) and
    `cooling_until` (the end of a cooling period under way: no cold contacts until then)."""
    found = list(Instance.objects.filter(project=project).order_by("priority", "pk"))
    counts = unacknowledged.by_instance()
    latest = {event.instance_id: event for event in InstanceHealthEvent.objects.filter(
        instance_id__in=[instance.pk for instance in found]).order_by("instance_id", "-at", "-id").distinct("instance_id")}
    now = timezone.now()
    for instance in found:
        instance.unacknowledged = counts.get(instance.pk, 0)  # type: ignore[attr-defined]
        paused = instance.cold_paused_until
        instance.cooling_until = paused if paused is not None and paused > now else None  # type: ignore[attr-defined]
        change = latest.get(instance.pk)
        if change is not None:
            change.explained = health.EXPLAINED.get(change.reason, change.reason)  # type: ignore[attr-defined]
        instance.health_change = change  # type: ignore[attr-defined]
    return found


def open_dead_letters(project: Project, environment: str, latest: int = 5) -> dict[str, Any]:
    rows = DeadLetter.objects.for_scope(project, environment).filter(status=DeadLetterStatus.OPEN)
    by_reason = list(rows.values("reason").annotate(n=Count("id")).order_by("-n", "reason"))
    return {
        "count": sum(r["n"] for r in by_reason),
        "by_reason": by_reason,
        # select_related: each row shows its message's recipient and category.
        "latest": list(rows.select_related("message").order_by("-created_at", "-pk")[:latest]),
    }
