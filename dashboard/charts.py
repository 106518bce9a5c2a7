"""What the overview's two charts draw: a project's messages per hour by status, and how long its
messages took from acceptance to delivery (p50/p90/p99 per hour), over the last 24 hours.

One grouped query per chart, for the member's own project and the mode's environment only, over the
hours' rows of the (project, environment, -created_at) index `msg_project_created`: the answer is at most
24 points per status and 24 per percentile, however much traffic there was. Both queries run under a statement timeout
(`DASHBOARD_CHART_TIMEOUT_MS`), so a huge day makes the charts unavailable, never the page slow.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import connection, transaction
from django.db.models import Aggregate, Count, DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.functions import TruncHour
from django.utils import timezone

from messaging.models import Message, Project, Status

HOURS = 24
PERCENTILES = (0.5, 0.9, 0.99)
UTC = dt_timezone.utc


class Percentiles(Aggregate):
    """percentile_cont(ARRAY[...]) WITHIN GROUP (ORDER BY expr): several percentiles in one pass."""

    function = "percentile_cont"
    template = "%(function)s(%(fractions)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, fractions: tuple[float, ...]) -> None:
        # Literal floats of our own (PERCENTILES), never input: safe to write into the SQL.
        literal = "ARRAY[" + ", ".join(repr(float(f)) for f in fractions) + "]::double precision[]"
        super().__init__(expression, fractions=literal, output_field=ArrayField(DurationField()))


def hours(now: datetime | None = None) -> list[datetime]:
    """The 24 hour buckets (UTC) ending with the current one, oldest first."""
    current = (now or timezone.now()).astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return [current - timedelta(hours=HOURS - 1 - i) for i in range(HOURS)]


def _in_window(project: Project, environment: str, buckets: list[datetime]) -> QuerySet[Message]:
    # Both bounds, so a clock running ahead never adds a 25th bucket.
    return Message.objects.for_scope(project, environment).filter(
        created_at__gte=buckets[0], created_at__lt=buckets[-1] + timedelta(hours=1)
    )


@dataclass
class Charts:
    hours: list[datetime]
    by_status: dict[str, list[int]]
    latency: dict[str, list[float | None]]
    delivered: list[int]

    def as_json(self) -> dict[str, Any]:
        return {
            "hours": [h.strftime("%Y-%m-%dT%H:%M:%SZ") for h in self.hours],
            "byStatus": [
                {"status": status, "label": Status(status).label, "counts": counts}
                for status, counts in self.by_status.items()
            ],
            "latency": {
                "unit": "seconds",
                **self.latency,
                "delivered": self.delivered,
            },
        }


def messages_by_status(project: Project, environment: str, buckets: list[datetime]) -> dict[str, list[int]]:
    """Messages accepted in each hour, by the status they have now: one list of 24 counts per status."""
    rows = (
        _in_window(project, environment, buckets)
        .annotate(hour=TruncHour("created_at", tzinfo=UTC))
        .values("hour", "status")
        .annotate(n=Count("id"))
    )
    index = {hour: i for i, hour in enumerate(buckets)}
    counts = {status: [0] * HOURS for status in Status.values}
    for row in rows:
        counts[row["status"]][index[row["hour"]]] = row["n"]
    return counts


def delivery_latency(
    project: Project, environment: str, buckets: list[datetime]
) -> tuple[dict[str, list[float | None]], list[int]]:
    """For messages accepted in each hour and delivered since: p50/p90/p99 of delivered_at - created_at
    in seconds (None for an hour with none delivered), and how many there were.

    A read receipt that arrives first also stamps delivered_at (messaging.lifecycle.advance), so a READ
    message counts; a force-resent one counts from its first acceptance, as its sender saw it.
    """
    took = ExpressionWrapper(F("delivered_at") - F("created_at"), output_field=DurationField())
    rows = (
        _in_window(project, environment, buckets)
        .filter(delivered_at__isnull=False)
        .annotate(hour=TruncHour("created_at", tzinfo=UTC))
        .values("hour")
        .annotate(n=Count("id"), took=Percentiles(took, PERCENTILES))
    )
    index = {hour: i for i, hour in enumerate(buckets)}
    names = [f"p{round(f * 100)}" for f in PERCENTILES]
    latency: dict[str, list[float | None]] = {name: [None] * HOURS for name in names}
    delivered = [0] * HOURS
    for row in rows:
        i = index[row["hour"]]
        delivered[i] = row["n"]
        for name, value in zip(names, row["took"]):
            latency[name][i] = round(value.total_seconds(), 3)
    return latency, delivered


def for_scope(project: Project, environment: str, now: datetime | None = None) -> Charts:
    """Both charts' data for one environment (the dashboard's mode), each query bounded by
    DASHBOARD_CHART_TIMEOUT_MS (a timeout raises django.db.OperationalError, which the view answers with 503)."""
    buckets = hours(now)
    with transaction.atomic(), connection.cursor() as cursor:
        # Local to this transaction (or, inside an outer one, put back below; a failure rolls it back with
        # the savepoint), so a persistent connection keeps no trace of it.
        cursor.execute("SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, true)",
                       [f"{settings.DASHBOARD_CHART_TIMEOUT_MS}ms"])
        previous = cursor.fetchone()[0]
        by_status = messages_by_status(project, environment, buckets)
        latency, delivered = delivery_latency(project, environment, buckets)
        cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
    return Charts(buckets, by_status, latency, delivered)
