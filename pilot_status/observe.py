"""Latency histograms (issue 24), on prometheus_client: observed in the process where the work happens.

- `pilot_status_accept_seconds{status}`: POST /v1/messages/send, from DRF's dispatch to the answer;
- `pilot_status_accept_to_sent_seconds{lane}`: a message's `created_at` to the moment it becomes SENT
  (`messaging.lifecycle.mark_sent`, in the lane worker);
- `pilot_status_gateway_call_seconds{outcome}`: one sendText call (`messaging.sending.gateway.send_text`),
  by the kind its answer was classified as;
- `pilot_status_webhook_seconds{status}`: Evolution's webhook and our forwards (`ingestion.views.webhook`).

Multiprocess mode: with `PROMETHEUS_MULTIPROC_DIR` set (scripts/env.sh sets `.state/prometheus`, compose
`/app/.state/prometheus` on the volume every container shares), every process (gunicorn's workers,
Celery's, the relays, the consumer) writes its observations to its own memory-mapped file there, and a
scrape of either web pool merges them all (pilot_status.scrape). A file is named after the process's
host and pid, not the pid alone: compose's containers share the directory and each has its own pids.
Without the variable each process keeps its own registry and a scrape sees the answering process only
(a development shell, a test). An observation is a few microseconds and no I/O beyond the page cache:
nothing here adds a round trip to the accept or send paths, and a failure to record is logged once
and never reaches the work.
"""

from __future__ import annotations

import logging
import os
import re
import socket

log = logging.getLogger(__name__)

MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or ""
if MULTIPROC_DIR:
    os.makedirs(MULTIPROC_DIR, exist_ok=True)  # before prometheus_client reads it

from prometheus_client import Histogram, values  # noqa: E402  (after the directory exists)

# The identity in the files' names: `histogram_<host>-<pid>.db`. prometheus_client splits a name on
# "_", so the host keeps letters, digits, "." and "-" only. Called on every observation: kept cheap.
HOST = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"


def process_identity() -> str:
    return f"{HOST}-{os.getpid()}"


if MULTIPROC_DIR:
    # Before the first metric is made (below): every value then lives in this process's file.
    values.ValueClass = values.MultiProcessValue(process_identity)  # type: ignore[no-untyped-call]

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_CALL = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_JOURNEY = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0)

ACCEPT = Histogram("pilot_status_accept_seconds", "POST /v1/messages/send, request to answer", ["status"],
                   buckets=_FAST)
ACCEPT_TO_SENT = Histogram("pilot_status_accept_to_sent_seconds", "A message's creation to SENT", ["lane"],
                           buckets=_JOURNEY)
GATEWAY_CALL = Histogram("pilot_status_gateway_call_seconds", "One sendText call to Evolution, by outcome",
                         ["outcome"], buckets=_CALL)
WEBHOOK = Histogram("pilot_status_webhook_seconds", "POST /api/internal/webhook, request to answer", ["status"],
                    buckets=_FAST)

_failed = False


def observe(histogram: Histogram, label: str, seconds: float) -> None:
    """Record one observation; never raises (a full disk or a removed directory loses it, not the work)."""
    global _failed
    try:
        histogram.labels(label).observe(max(0.0, seconds))
    except Exception as exc:
        if not _failed:
            _failed = True
            log.warning("metrics: %s not observed (%s); further failures are not logged", histogram, exc)
