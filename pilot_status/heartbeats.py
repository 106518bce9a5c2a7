"""Heartbeats in Redis: proof that each long-running process, and each beat task, is alive.

Beat tasks: one hash, `ps:maintenance:heartbeats`, one field per task name: `{"at", "seconds", "state", "worker"}`
(the end of its last run, how long it took, Celery's state, the worker that ran it). Written by a task_postrun hook
(pilot_status/celery.py); read by GET /api/internal/metrics, the status page and the beat test.

Processes (relays, the consumer, every Celery worker, beat): one key per running process,
`ps:heartbeat:<name>@<host>:<pid>`, `{"process", "host", "pid", "at", "started"}`, rewritten every
`HEARTBEAT_SECONDS` by the process's own loop (the relay's and the consumer's) or by a thread (Celery
workers and beat, started on worker_ready / beat_init), with a TTL of `HEARTBEAT_TTL_SECONDS`; the set
`ps:heartbeats` indexes them. A heartbeat older than `HEARTBEAT_STALE_SECONDS` is stale (the status page
flags it, `manage.py heartbeat_check` fails on it); one older than the TTL is gone, and so is the process
from the page. Redis being away only loses heartbeats.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

KEY = "ps:maintenance:heartbeats"
PROCESS_PREFIX = "ps:heartbeat:"
PROCESS_INDEX = "ps:heartbeats"
# HEARTBEAT_STALE_SECONDS's default (settings/base.py), also read by heartbeat_check without Django.
DEFAULT_STALE_SECONDS = 30.0


def _redis() -> Any:
    from .metrics import redis

    return redis()


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


def _settings() -> Any:
    from django.conf import settings

    return settings


class Process:
    """This process's heartbeat: `beat()` from its loop writes one at most every HEARTBEAT_SECONDS."""

    def __init__(self, name: str):
        self.name = name
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started = time.time()
        self.key = f"{PROCESS_PREFIX}{name}@{self.host}:{self.pid}"
        self._last = 0.0
        self._stopped = False
        # A beat and the stop's removal, one at a time: a background beat already past its check would
        # otherwise write the heartbeat back after the removal.
        self._writing = threading.Lock()

    def beat(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last < _settings().HEARTBEAT_SECONDS:
            return
        with self._writing:
            if self._stopped:
                return
            self._write(now)

    def _write(self, now: float) -> None:
        self._last = now
        value = {"process": self.name, "host": self.host, "pid": self.pid, "at": now, "started": self.started}
        try:
            pipe = _redis().pipeline(transaction=False)
            pipe.set(self.key, json.dumps(value), ex=_settings().HEARTBEAT_TTL_SECONDS)
            pipe.sadd(PROCESS_INDEX, self.key)
            pipe.execute()
        except Exception as exc:  # Redis down: a later beat writes it
            # Not again for three periods: each try may cost Redis's connect timeout (0.5 s) in the
            # relay's loop, and a heartbeat nobody can read meanwhile is worth less than a release.
            self._last = now + 2 * _settings().HEARTBEAT_SECONDS
            log.debug("heartbeat of %s not recorded: %s", self.name, exc)

    def forget(self) -> None:
        """A clean stop: the process leaves the page instead of turning stale."""
        with self._writing:
            self._stopped = True  # no beat after this
            self._remove()

    def _remove(self) -> None:
        try:
            pipe = _redis().pipeline(transaction=False)
            pipe.delete(self.key)
            pipe.srem(PROCESS_INDEX, self.key)
            pipe.execute()
        except Exception as exc:
            log.debug("heartbeat of %s not removed: %s", self.name, exc)


def beat_in_background(name: str) -> Process:
    """For processes whose loop is not ours (Celery workers, beat): a daemon thread beats for them, and a
    normal exit (SIGTERM's warm shutdown included) removes the heartbeat. Pool processes forked later end
    with os._exit, so they never remove their parent's."""
    process = Process(name)
    atexit.register(process.forget)

    def run() -> None:
        while not process._stopped:
            process.beat(force=True)
            time.sleep(_settings().HEARTBEAT_SECONDS)

    threading.Thread(target=run, name=f"heartbeat {name}", daemon=True).start()
    return process


def processes(now: float | None = None, client: Any = None, stale_after: float | None = None) -> list[dict[str, Any]]:
    """Every process's last heartbeat, oldest first, each with its `age_seconds` and `stale` flag.

    `client` and `stale_after` default to Django's Redis and HEARTBEAT_STALE_SECONDS (heartbeat_check
    passes its own, without loading Django). Raises when Redis cannot be read (the caller says so
    instead of listing nothing)."""
    now = now or time.time()
    client = client if client is not None else _redis()
    stale_after = stale_after if stale_after is not None else _settings().HEARTBEAT_STALE_SECONDS
    keys = sorted(k.decode() if isinstance(k, bytes) else str(k) for k in client.smembers(PROCESS_INDEX))
    if not keys:
        return []
    values = client.mget(keys)
    gone = [key for key, value in zip(keys, values) if value is None]
    if gone:  # past their TTL: the process has been away that long
        client.srem(PROCESS_INDEX, *gone)
    found = []
    for value in values:
        if value is None:
            continue
        beat = json.loads(value)
        age = max(0.0, now - float(beat["at"]))
        found.append({**beat, "age_seconds": round(age, 1), "stale": age > stale_after})
    return sorted(found, key=lambda beat: (beat["process"], beat["host"], beat["pid"]))
