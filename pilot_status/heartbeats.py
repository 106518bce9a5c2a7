"""The last run of each beat task, in Redis: proof that beat and the maintenance workers are alive.

One hash, `ps:maintenance:heartbeats`, one field per task name: `{"at", "seconds", "state", "worker"}`
(the end of its last run, how long it took, Celery's state, the worker that ran it). Written by a task_postrun hook
(pilot_status/celery.py); read by GET /api/internal/metrics and the beat test. Redis being away only
loses a heartbeat.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

KEY = "ps:maintenance:heartbeats"


def _redis() -> Any:
    from django_redis import get_redis_connection

    return get_redis_connection("default")


def record(task: str, started: float | None, state: str, worker: str = "") -> None:
    now = time.time()
    value = {"at": now, "seconds": round(now - started, 3) if started else None, "state": state, "worker": worker}
    try:
        _redis().hset(KEY, task, json.dumps(value))
    except Exception as exc:  # Redis down: the next run writes it
        log.debug("heartbeat of %s not recorded: %s", task, exc)


def read() -> dict[str, dict[str, Any]]:
    try:
        raw = _redis().hgetall(KEY)
    except Exception:
        return {}
    return {
        (name.decode() if isinstance(name, bytes) else str(name)): json.loads(value)
        for name, value in raw.items()
    }
