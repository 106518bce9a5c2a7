"""R10's extra processes beside the chaos stack (which runs one web pool, serving /api/internal/ too, one relay,
one consumer and one worker per lane, and no webhook pool, maintenance worker, callbacks worker or beat): the
second copies of the stack's own, two webhook pools, two of each maintenance worker (maintenance, sync, bulk),
two callbacks workers, one beat, and a second beat that must be refused. Every command is the topology's
(pilot_status/topology.py) on the stack's site; each copy of a Celery worker gets a node name of its own
(`<queue>@r10-1`, `<queue>@r10-2`), as docs/scaling.md asks."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import Any

from ..context import Context

MAINTENANCE_WORKERS = ("worker_maintenance", "worker_sync", "worker_bulk", "worker_callbacks", "worker_callbacks_relay")
BEAT_REFUSED = "another beat already runs"


def start_copies(ctx: Context) -> dict[str, Any]:
    """Every copy R10 adds, started and ready: {"processes": {name: Process}, "web2_url", "webhook_urls"}."""
    from pilot_status import topology
    from tests.support.processes import LANES, Process, free_port, log_size, wait_for_log, wait_for_port

    from ..stack import webhook_pool_argv

    stack = ctx.stack
    port = free_port()
    web2_url = f"http://127.0.0.1:{port}"
    web2_argv = list(stack.processes["web"].argv)
    web2_argv[web2_argv.index("-b") + 1] = f"127.0.0.1:{port}"
    webhook_ports = [free_port(), free_port()]
    webhook_urls = [f"http://127.0.0.1:{p}" for p in webhook_ports]
    # The second consumer forwards to the second webhook pool (the stack's own forwards to web, which serves
    # /api/internal/ too), so that forwards reach two pools.
    env2 = {**stack.env, "PORT": str(port), "INTERNAL_WEBHOOK_URL": f"{webhook_urls[1]}/api/internal/webhook"}
    copies: dict[str, Any] = {
        "web-2": Process("web-2", web2_argv, env2),
        "relay-2": Process("relay-2", list(stack.processes["relay"].argv), env2),
        "consumer-2": Process("consumer-2", list(stack.processes["consumer"].argv), env2),
    }
    for n, webhook_port in enumerate(webhook_ports, 1):
        copies[f"webhook-{n}"] = Process(f"webhook-{n}", webhook_pool_argv(webhook_port), dict(stack.env))
    for lane in LANES:
        worker = stack.lane_worker(lane)
        copies[f"worker-{lane}-2"] = Process(
            f"worker-{lane}-2", [sys.executable, "-m", "celery", *worker.celery_args(hostname=f"{lane}@r10-second")],
            {**env2, **worker.env()})
    for name in MAINTENANCE_WORKERS:
        for n in (1, 2):
            site = replace(stack.site(), node=f"r10-{n}")
            service = topology.process(name).service
            copies[f"{service}-{n}"] = Process(f"{service}-{n}", topology.process(name).command(site), dict(stack.env))
    copies["beat"] = Process("beat", topology.process("beat").command(stack.site()), dict(stack.env))
    offsets = {name: log_size(p.log) for name, p in copies.items()}
    for process in copies.values():
        process.start()
    wait_for_port(port, proc=copies["web-2"].proc)
    for n, webhook_port in enumerate(webhook_ports, 1):
        wait_for_port(webhook_port, proc=copies[f"webhook-{n}"].proc)
    workers = [name for name in copies if name.startswith("worker-")]
    for name in workers:
        wait_for_log(copies[name].log, "ready.", proc=copies[name].proc, start_at=offsets[name], timeout=90)
    wait_for_log(copies["consumer-2"].log, "Connected to amqp", proc=copies["consumer-2"].proc,
                 start_at=offsets["consumer-2"])
    wait_for_log(copies["beat"].log, "beat lock: held", proc=copies["beat"].proc, start_at=offsets["beat"], timeout=60)
    return {"processes": copies, "web2_url": web2_url, "webhook_urls": webhook_urls}


def second_beat(ctx: Context, timeout: float = 90.0) -> dict[str, Any]:
    """A second beat on the same database, while the first runs: it must exit with status 3 (beat_lock's
    LOCKED_EXIT) and say which beat holds the lock."""
    from pilot_status import beat_lock, topology
    from tests.support.processes import Process, log_size

    beat = Process("beat-2", topology.process("beat").command(ctx.stack.site()), dict(ctx.stack.env))
    offset = log_size(beat.log)
    started = time.monotonic()
    beat.start()
    assert beat.proc is not None
    try:
        code = beat.proc.wait(timeout=timeout)
    except Exception:
        beat.stop()
        code = None
    with open(beat.log, "rb") as handle:
        handle.seek(offset)
        said = [line for line in handle.read().decode(errors="replace").splitlines() if BEAT_REFUSED in line]
    return {"exit_status": code, "expected": beat_lock.LOCKED_EXIT, "refused_in_s": round(time.monotonic() - started, 1),
            "said": said[0][:240] if said else None}


def queue_consumers(queues: tuple[str, ...]) -> dict[str, int]:
    """Consumers RabbitMQ counts on each Celery queue (passive declare on the broker)."""
    from pilot_status.celery import app

    counts: dict[str, int] = {}
    with app.connection_for_write() as conn:
        for queue in queues:
            channel: Any = conn.channel()
            try:
                counts[queue] = channel.queue_declare(queue, passive=True).consumer_count
            finally:
                channel.close()
    return counts


def create_endpoint(ctx: Context, tenant: Any, url: str) -> dict[str, Any]:
    """A `message.status` endpoint through the API, as a customer registers one (the answer holds the secret)."""
    import requests

    r = requests.post(f"{ctx.stack.web_url}/v1/webhook-endpoints", json={"url": url, "eventTypes": ["message.status"]},
                      headers={"Authorization": f"Bearer {tenant.live_key}"}, timeout=15)
    if r.status_code != 201:
        raise RuntimeError(f"endpoint refused: {r.status_code} {r.text[:300]}")
    return dict(r.json())


def callbacks_owed(tenant: Any) -> set[int]:
    """Every status line of the tenant's messages (a `message.status` callback each)."""
    from callbacks.derive_events import STATUS_KINDS
    from messaging.models import MessageEvent

    return set(MessageEvent.objects.filter(kind__in=STATUS_KINDS, message__project=tenant.project)
               .values_list("pk", flat=True))


def callback_figures(tenant: Any, receiver: Any) -> dict[str, Any]:
    """Owed against received (2xx, signature held) by sequence; the same webhook-id delivered twice counted."""
    from collections import Counter

    owed = callbacks_owed(tenant)
    everything = list(receiver.received)
    accepted = [r for r in everything if r.answered == 204]
    sequences = {int(r.payload["data"]["sequence"]) for r in accepted}
    webhook_ids = Counter(r.headers.get("webhook-id", "") for r in accepted)
    return {"owed": len(owed), "received_2xx": len(accepted), "lost": len(owed - sequences),
            "delivered_more_than_once": sum(1 for n in webhook_ids.values() if n > 1),
            "bad_signatures": sum(1 for r in everything if not r.verified)}

