"""GET /metrics: Prometheus's scrape (issue 24), `Authorization: Bearer <METRICS_TOKEN>`, on both web pools.

What it serves, in Prometheus's text format:
- the latency histograms (pilot_status.observe), merged over every process that writes to
  `PROMETHEUS_MULTIPROC_DIR` (without it, the answering process's own);
- gauges read at scrape time by `StateCollector`, with the status page's own readers (pilot_status.status):
  the outbox per lane (`pilot_status_outbox_depth`, `_due`, `_oldest_age_seconds`, `_oldest_due_age_seconds`),
  each Celery queue's ready tasks and consumers (`pilot_status_queue_ready`, `pilot_status_queue_consumers`),
  each circuit (`pilot_status_circuit_state{scope,name}`: 0 closed, 1 half-open, 2 open), each process's
  heartbeat (`pilot_status_heartbeat_age_seconds{process,host,pid}`, `pilot_status_heartbeat_stale`), each
  instance's recent sends WhatsApp never acknowledged (`pilot_status_unacknowledged_sends{name}`,
  messaging.unacknowledged; an instance with none is absent), each instance's health state as the governor judged
  it (`pilot_status_instance_health{name}`: 0 healthy, 1 at risk, 2 resting, 3 restricted; messaging.governor);
- the Redis counters (`ps:metrics:*`, pilot_status.metrics) as they are, one counter per key, named as the
  old text output named them (`ps:metrics:evolution:webhook:processed` →
  `pilot_status_evolution_webhook_processed_total`; `messages:status:<S>:<lane>` and `messages:failed:<R>:<lane>`
  with labels).

The readers run at once, each on its own thread and connection, within `METRICS_SCRAPE_TIMEOUT_SECONDS`; one
that fails or is late is left out and `pilot_status_scrape_source_up{source}` says 0 for it: Redis, Postgres
or the broker being away never fails the scrape. Its cost is the status page's: a grouped count over the
outbox, a passive queue_declare per queue, one MGET per kind of key.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from . import heartbeats, metrics, observe, status
from .errors import error_response
from .health import run_within

T = TypeVar("T")
_CIRCUIT_VALUE = {"closed": 0, "half_open": 1, "open": 2}


def _counters() -> dict[str, int]:
    return metrics.read_all()


SOURCES: dict[str, Callable[[], Any]] = {
    "outbox": status.SECTIONS["outbox"],
    "queues": status.SECTIONS["queues"],
    "circuits": lambda: _in_thread(status.circuit_states),
    "heartbeats": heartbeats.processes,
    "counters": _counters,
    "unacknowledged": lambda: _in_thread(_unacknowledged),
    "health": lambda: _in_thread(_health),
}


def _unacknowledged() -> dict[str, int]:
    from messaging import unacknowledged

    return unacknowledged.by_instance_name()


def _health() -> dict[str, str]:
    from messaging import governor

    return governor.states()


def _in_thread(read: Callable[[], T]) -> T:
    from django.db import connection

    try:
        return read()
    finally:
        connection.close()  # this thread's own connection: it ends with the thread


def _gauge(name: str, help_text: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, labels=labels)


def _outbox(lanes: dict[str, Any]) -> Iterable[Metric]:
    fields = {
        "depth": ("pilot_status_outbox_depth", "Outbox rows waiting, per lane"),
        "due": ("pilot_status_outbox_due", "Outbox rows due now, per lane"),
        "oldest_age_seconds": ("pilot_status_outbox_oldest_age_seconds", "Age of the oldest outbox row (0: none)"),
        "oldest_due_age_seconds": ("pilot_status_outbox_oldest_due_age_seconds",
                                   "How long the oldest due row has been due (0: none)"),
    }
    for field, (name, help_text) in fields.items():
        family = _gauge(name, help_text, ["lane"])
        for lane, row in sorted(lanes.items()):
            family.add_metric([lane], float(row.get(field) or 0))
        yield family


def _queues(queues: dict[str, Any]) -> Iterable[Metric]:
    ready = _gauge("pilot_status_queue_ready", "Ready tasks in each Celery queue", ["queue"])
    consumers = _gauge("pilot_status_queue_consumers", "Consumers of each Celery queue", ["queue"])
    for name, row in sorted(queues.items()):
        if "ready" in row:  # a queue not declared yet has only an error
            ready.add_metric([name], float(row["ready"]))
            consumers.add_metric([name], float(row["consumers"]))
    return [ready, consumers]


def _circuits(states: tuple[dict[str, Any], dict[str, dict[str, Any]]]) -> Iterable[Metric]:
    gateway, instances = states
    family = _gauge("pilot_status_circuit_state", "Circuit state: 0 closed, 1 half-open, 2 open", ["scope", "name"])
    family.add_metric(["gateway", ""], _CIRCUIT_VALUE.get(gateway["state"], 2))
    for name, state in sorted(instances.items()):
        family.add_metric(["instance", name], _CIRCUIT_VALUE.get(state["state"], 2))
    return [family]


def _unacknowledged_sends(counts: dict[str, int]) -> Iterable[Metric]:
    family = _gauge("pilot_status_unacknowledged_sends",
                    "Sends of the last 24 h WhatsApp has not acknowledged within ACK_TIMEOUT_SECONDS, per instance",
                    ["name"])
    for name, count in sorted(counts.items()):
        family.add_metric([name], float(count))
    return [family]


def _instance_health(states: dict[str, str]) -> Iterable[Metric]:
    from messaging import health

    family = _gauge("pilot_status_instance_health",
                    "Each instance's health: 0 healthy, 1 at risk (caps cut), 2 resting, 3 restricted", ["name"])
    level = {str(state): severity for state, severity in health.SEVERITY.items()}
    for name, state in sorted(states.items()):
        family.add_metric([name], float(level.get(state, 3)))
    return [family]


def _heartbeats(beats: list[dict[str, Any]]) -> Iterable[Metric]:
    # `host` and `pid`, not `instance`: Prometheus gives that label to the scraped target.
    age = _gauge("pilot_status_heartbeat_age_seconds", "Age of each process's last heartbeat", ["process", "host", "pid"])
    stale = _gauge("pilot_status_heartbeat_stale", "1 when the heartbeat is older than HEARTBEAT_STALE_SECONDS",
                   ["process", "host", "pid"])
    for beat in beats:
        labels = [str(beat["process"]), str(beat["host"]), str(beat["pid"])]
        age.add_metric(labels, float(beat["age_seconds"]))
        stale.add_metric(labels, 1.0 if beat["stale"] else 0.0)
    return [age, stale]


def _counter_families(counters: dict[str, int]) -> Iterable[Metric]:
    families: dict[str, tuple[list[str], CounterMetricFamily]] = {}
    for key, value in sorted(counters.items()):
        name, labels = metrics.series(key)
        if name not in families:
            names = sorted(labels)
            families[name] = names, CounterMetricFamily(name, "A Redis counter (ps:metrics:*)", labels=names)
        names, family = families[name]
        if sorted(labels) == names:  # a stray key of another shape under the same name is left out
            family.add_metric([labels[label] for label in names], float(value))
    return [family for _, family in families.values()]


_RENDER: dict[str, Callable[[Any], Iterable[Metric]]] = {"outbox": _outbox, "queues": _queues, "circuits": _circuits, "heartbeats": _heartbeats,
           "counters": _counter_families, "unacknowledged": _unacknowledged_sends, "health": _instance_health}


class StateCollector(Collector):
    """The gauges and the counters, read when Prometheus scrapes."""

    def collect(self) -> Iterable[Metric]:
        results = run_within(SOURCES, settings.METRICS_SCRAPE_TIMEOUT_SECONDS)
        up = _gauge("pilot_status_scrape_source_up", "1 when the source was read for this scrape", ["source"])
        took = _gauge("pilot_status_scrape_source_seconds", "How long each source took to read", ["source"])
        for source, result in results.items():
            up.add_metric([source], 1.0 if result["ok"] else 0.0)
            took.add_metric([source], float(result["ms"]) / 1000)
            if result["ok"]:
                yield from _RENDER[source](result["value"])
        yield up
        yield took


class _ProcessRegistry(Collector):
    """Single-process mode: this process's own histograms (and prometheus_client's process metrics)."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def registry() -> CollectorRegistry:
    scraped = CollectorRegistry(auto_describe=False)
    if observe.MULTIPROC_DIR:
        MultiProcessCollector(scraped, path=observe.MULTIPROC_DIR)  # type: ignore[no-untyped-call]
    else:
        scraped.register(_ProcessRegistry())
    scraped.register(StateCollector())
    return scraped


def _allowed(request: HttpRequest) -> bool:
    from ingestion.auth import credential

    token = settings.METRICS_TOKEN
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if not token or not header.startswith("Bearer "):
        return False
    given = credential(header[len("Bearer "):].strip())
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


@require_GET
def scrape(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        return error_response(401, "unauthorized", "The metrics need `Authorization: Bearer <METRICS_TOKEN>`.")
    response = HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response

