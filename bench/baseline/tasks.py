"""B2's baseline: a trivial task that only counts itself, so the bench knows when all ran."""

from __future__ import annotations

from celery import shared_task
from django_redis import get_redis_connection

BASELINE_TASK = "bench.trivial"
COUNTER_KEY = "ps:bench:trivial_done"


@shared_task(name=BASELINE_TASK, ignore_result=True)
def trivial() -> None:
    get_redis_connection("default").incr(COUNTER_KEY)
