"""Counters in Redis (docs/internals.md, "Path of an event", Counters): `ps:metrics:evolution:*` and `ps:metrics:messages:*`.

Counting must never break the work it counts: when Redis is down, counts are lost, work is not.

Message counters are derived from the timeline: every `MessageEvent` written through
`Message.record` is counted once its transaction commits, so every status change by any
process (API, lane worker, ingestion, reconcilers, dashboard) is counted in one place:
`messages:status:<STATUS>:<lane>` and `messages:failed:<REASON>:<lane>`.

A count waits in its process for up to METRICS_FLUSH_SECONDS and goes to Redis with the others of
that moment, in one pipeline: a Redis round trip per count was a tenth of an accept's CPU (bench
B1) and of a send's (B2). A counter may lag by that long; a process killed outright loses its
last second of counts, one that exits cleanly sends them first.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db import transaction
from django.dispatch import receiver
from django_redis import get_redis_connection

log = logging.getLogger(__name__)

PREFIX = "ps:metrics:"
EVOLUTION = PREFIX + "evolution:"
MESSAGES = PREFIX + "messages:"


_client: Any = None
_client_lock = threading.Lock()


def redis() -> Any:
    """The process's Redis client, one for all its threads: a redis-py client is safe to share and its pool is
    the process's already. Django's caches, and django-redis's clients with them, are per thread: a lane
    worker's 384 threads each built their own (about 18 KB a thread: bench/thread_memory.py)."""
    global _client
    client = _client
    if client is None:
        with _client_lock:
            if _client is None:
                _client = get_redis_connection("default")
            client = _client
    return client


@receiver(setting_changed)
def _forget_client(setting: str, **kwargs: Any) -> None:
    # A test that points CACHES elsewhere gets a client for it.
    global _client
    if setting == "CACHES":
        _client = None


# Counts made while this thread holds a batch (ingestion's event lock) wait in it and go to Redis
# with the lock's release, in the same pipeline: one round trip for all of an event's counters.
_batch = threading.local()


@contextmanager
def batched() -> Iterator[list[tuple[str, int]]]:
    """Collect this thread's counts instead of sending each; the caller sends the list it is given
    (`send(pending, pipe)`). A batch opened inside another collects its own counts, then the outer
    one collects again."""
    pending: list[tuple[str, int]] = []
    outer = getattr(_batch, "pending", None)
    _batch.pending = pending
    try:
        yield pending
    finally:
        _batch.pending = outer


def send(pending: list[tuple[str, int]], pipe: Any) -> None:
    """Queue collected counts on a Redis pipeline (executed by the caller)."""
    for name, amount in pending:
        pipe.incrby(name, amount)


class _Carry:
    """This process's counts not yet in Redis, sent by a daemon thread every METRICS_FLUSH_SECONDS.

    Counts that Redis refused are kept for the next flush (there are a few dozen counter names, so
    the dict stays small however long Redis is away).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._owner = 0  # pid whose flusher thread runs; a forked child starts its own

    def add(self, name: str, amount: int) -> None:
        with self._lock:
            self._pending[name] = self._pending.get(name, 0) + amount
            if self._owner != os.getpid():
                self._owner = os.getpid()
                threading.Thread(target=self._run, name="metrics-flush", daemon=True).start()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        try:
            # MULTI/EXEC: a flush that fails half-way has counted nothing, so keeping it is right.
            pipe = redis().pipeline(transaction=True)
            send(list(pending.items()), pipe)
            pipe.execute()
        except Exception as exc:  # Redis down: kept for the next flush
            log.debug("%d metrics not sent yet: %s", len(pending), exc)
            with self._lock:
                for name, amount in pending.items():
                    self._pending[name] = self._pending.get(name, 0) + amount

    def forget_after_fork(self) -> None:
        # The parent sends its own counts; a child that kept a copy would count them twice.
        self._lock = threading.Lock()
        self._pending = {}
        self._owner = 0

    def _run(self) -> None:
        while True:
            time.sleep(settings.METRICS_FLUSH_SECONDS or 1.0)
            self.flush()


_carry = _Carry()


def flush() -> None:
    """Send this process's waiting counts now (at shutdown, or before reading the counters)."""
    _carry.flush()


os.register_at_fork(after_in_child=lambda: _carry.forget_after_fork())
atexit.register(flush)


def incr(name: str, amount: int = 1) -> None:
    pending = getattr(_batch, "pending", None)
    if pending is not None:
        pending.append((name, amount))
        return
    if settings.METRICS_FLUSH_SECONDS > 0:
        _carry.add(name, amount)
        return
    try:
        redis().incrby(name, amount)
    except Exception as exc:  # Redis down: see module docstring.
        log.debug("metric %s not counted: %s", name, exc)


def evolution(name: str, amount: int = 1) -> None:
    incr(EVOLUTION + name, amount)


def messages(name: str, amount: int = 1) -> None:
    incr(MESSAGES + name, amount)


def read_all() -> dict[str, int]:
    """Every counter, for the metrics endpoints. Raises when Redis is unreachable."""
    flush()
    client = redis()
    keys = sorted(k.decode() if isinstance(k, bytes) else k for k in client.scan_iter(match=PREFIX + "*", count=500))
    values = client.mget(keys) if keys else []
    counters: dict[str, int] = {}
    for key, value in zip(keys, values):
        try:
            counters[key] = int(value or 0)
        except ValueError:
            continue  # not a counter (someone else's key under our prefix)
    return counters


# ---- message counters from the timeline ---------------------------------------------------

# Timeline kinds that are a status of their own (the rest carry it in detail["status"]).
_KIND_STATUS = {"ACCEPTED": "QUEUED", "FAILED": "FAILED", "RESENT": "QUEUED"}


def message_counter_names(kind: str, detail: dict[str, Any], lane: str) -> list[str]:
    names: list[str] = []
    status = detail.get("status") if kind == "STATUS" else _KIND_STATUS.get(kind)
    if isinstance(status, str) and status:
        names.append(f"status:{status}:{lane}")
    if kind == "FAILED" and isinstance(detail.get("reason"), str):
        names.append(f"failed:{detail['reason']}:{lane}")
    if kind == "RESENT":
        names.append(f"resent:{lane}")
    return names


def count_message_event(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    """post_save receiver for messaging.MessageEvent (connected by the ingestion app)."""
    if not created:
        return
    try:
        message = instance.message  # cached by Message.record: no query
        names = message_counter_names(instance.kind, instance.detail or {}, message.category.lower())
    except Exception:
        return
    if names:
        # Counted only if the status change really commits.
        transaction.on_commit(lambda: _count_all(names))


def _count_all(names: list[str]) -> None:
    for name in names:
        messages(name)


# ---- Prometheus text format ---------------------------------------------------------------

_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series(key: str) -> tuple[str, dict[str, str]]:
    """A Redis counter key as a Prometheus metric name and labels."""
    name = key[len(PREFIX):] if key.startswith(PREFIX) else key
    parts = name.split(":")
    if parts[0] == "messages" and len(parts) == 4 and parts[1] == "status":
        return "pilot_status_messages_status_total", {"status": parts[2], "lane": parts[3]}
    if parts[0] == "messages" and len(parts) == 4 and parts[1] == "failed":
        return "pilot_status_messages_failed_total", {"reason": parts[2], "lane": parts[3]}
    return "pilot_status_" + _UNSAFE.sub("_", name).lower() + "_total", {}


def prometheus_text(counters: dict[str, int]) -> str:
    by_name: dict[str, list[tuple[dict[str, str], int]]] = {}
    for key, value in sorted(counters.items()):
        metric, labels = series(key)
        by_name.setdefault(metric, []).append((labels, value))
    lines: list[str] = []
    for metric, samples in sorted(by_name.items()):
        lines.append(f"# TYPE {metric} counter")
        for labels, value in samples:
            rendered = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items()))
            lines.append(f"{metric}{{{rendered}}} {value}" if rendered else f"{metric} {value}")
    return "\n".join(lines) + "\n"
