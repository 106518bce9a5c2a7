"""B5: ingestion of status events that arrive twice, by webhook and by RabbitMQ (100 % duplicates).

N messages are put in SENT with an Evolution id (bulk accept path without outbox, then one UPDATE);
the simulator is then asked to emit one DELIVERY_ACK per message (`/_control/emit`), which it sends
both ways, exactly like Evolution. Measured: unique events applied per second, from the first emit
to the last event processed and every message DELIVERED. The baseline is B1's bare insert view,
measured again right before and right after each run.
"""

from __future__ import annotations

import time
from typing import Any

import requests

from ..backlog import bulk_accept, live_key
from ..context import Context, cpu_summary, per_unit, wait_for
from ..stats import Spread

EVOLUTION_COUNTERS = "ps:metrics:evolution:*"


def prepare(ctx: Context, count: int) -> list[tuple[str, str, str]]:
    """SENT messages with Evolution ids; returns (message id, keyId, remoteJid)."""
    from django.db import connection

    world = ctx.world
    ids = bulk_accept(world.a.project, live_key(world.a.project), world.a.recipients, count, "UTILITY", enqueue=False)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE messaging_message
               SET status = 'SENT', sent_at = now(), attempts = 1,
                   evolution_message_id = 'BENCH' || upper(substr(md5(id::text), 1, 16)),
                   remote_jid = substr("to", 2) || '@s.whatsapp.net'
             WHERE id = ANY(%s::uuid[])
            RETURNING id::text, evolution_message_id, remote_jid
            """,
            [ids],
        )
        return list(cursor.fetchall())


def emit_all(ctx: Context, instance: str, instance_id: str, rows: list[tuple[str, str, str]]) -> None:
    """Ask the simulator for one DELIVERY_ACK per row, in batches, keeping its webhooks in flight bounded.

    Closed loop, like wrk's fixed connections: the next batch goes out when at most
    `b5_pending` webhooks are pending, so the receiver is always busy but no webhook waits
    past Evolution's timeout (which would turn into retries, i.e. extra load the figure would pay).
    The simulator holds the call until then (`wait_below`): polling its stats instead cost both
    processes about 50 HTTP calls a second, on the cores the system under test needs.
    """
    session = requests.Session()
    size, pending = ctx.sizes.b5_batch, ctx.sizes.b5_pending
    for start in range(0, len(rows), size):
        batch = [{"keyId": key_id, "remoteJid": jid, "fromMe": True, "status": "DELIVERY_ACK",
                  "instanceId": instance_id, "messageId": start + n}
                 for n, (_, key_id, jid) in enumerate(rows[start:start + size])]
        response = session.post(f"{ctx.sim.base_url}/_control/emit",
                                 json={"instance": instance, "event": "messages.update", "batch": batch,
                                       "wait_below": pending}, timeout=120)
        response.raise_for_status()


def evolution_counters() -> dict[str, int]:
    from pilot_status import metrics

    keys = metrics.redis().keys(EVOLUTION_COUNTERS)
    values = metrics.redis().mget(keys) if keys else []
    return {k.decode().removeprefix("ps:metrics:evolution:"): int(v or 0) for k, v in zip(keys, values)}


def applied(ids: list[str], count: int) -> Any:
    """Every event processed and every message DELIVERED.

    The database decides, but is asked only once the counters (bumped after each commit) say
    every event was handled: a poll with 4,000 ids every 0.25 s was load of its own.
    """
    from django.db.models import Count, Q

    from ingestion.models import IngestionEvent
    from messaging.models import Message

    if evolution_counters().get("webhook:processed", 0) < count:
        return False

    events = IngestionEvent.objects.aggregate(n=Count("pk"), processed=Count("pk", filter=Q(processed_at__isnull=False)))
    delivered = Message.objects.filter(pk__in=ids, status="DELIVERED").count()
    return events["processed"] >= count and delivered >= count and (events, delivered)


def copies_handled(count: int) -> bool:
    # Every RabbitMQ copy ends as skipped (already processed), forwarded or parked; one that met
    # the other channel's lock waits in a delay queue first (ingestion/consumer.py).
    c = evolution_counters()
    return c.get("rabbitmq:skipped", 0) + c.get("rabbitmq:forward_ok", 0) + c.get("rabbitmq:parked", 0) >= count


def one_run(ctx: Context, count: int) -> dict[str, Any]:
    from django.db.models import Count, Q

    from ingestion.models import IngestionEvent
    from messaging.models import Message
    from pilot_status import metrics

    ctx.fresh()
    keys = metrics.redis().keys(EVOLUTION_COUNTERS)
    if keys:
        metrics.redis().delete(*keys)
    instance = ctx.world.a.instance.name
    instance_id = ctx.sim.configure(instance)["id"]
    rows = prepare(ctx, count)
    ids = [r[0] for r in rows]
    sim_before = ctx.sim.stats()
    with ctx.cpu(servers=True) as cpu:
        started = time.time()
        emit_all(ctx, instance, instance_id, rows)
        emitted_s = time.time() - started
        met, _ = wait_for(lambda: applied(ids, count), ctx.sizes.wait_timeout, 0.25)
        finished = time.time()
        all_copies, _ = wait_for(lambda: copies_handled(count), ctx.sizes.wait_timeout, 0.25)
        copies_done = time.time()
    # This run's events only: a copy of the previous run's event still in flight in the consumer
    # when the tables were emptied lands as a row of its own (a stray, reported apart).
    ours = IngestionEvent.objects.filter(key_id__in=[r[1] for r in rows])
    events = ours.aggregate(n=Count("pk"), processed=Count("pk", filter=Q(processed_at__isnull=False)))
    strays = IngestionEvent.objects.count() - events["n"]
    by_channel = dict(ours.values_list("channel").annotate(n=Count("pk")))
    delivered = Message.objects.filter(pk__in=ids, status="DELIVERED").count()
    sim_after = ctx.sim.stats()
    counters = evolution_counters()
    return {
        "events": count,
        "emit_s": round(emitted_s, 2),
        "all_applied": met,
        "rate": count / (finished - started) if met else float("nan"),
        # Both copies of every event handled (the duplicates' tail: the consumer's queue drained).
        "all_copies_handled": all_copies,
        "rate_with_copies": count / (copies_done - started) if met and all_copies else float("nan"),
        "inbox_rows": events["n"], "inbox_processed": events["processed"], "inbox_by_channel": by_channel,
        "stray_rows": strays,
        "messages_delivered": delivered,
        "webhooks_posted": sim_after["webhook"]["posted"] - sim_before["webhook"]["posted"],
        "rabbitmq_published": sim_after["rabbitmq"]["published"] - sim_before["rabbitmq"]["published"],
        "metrics": counters,
        # Both copies of one event, every process and server, the load generator's polling included.
        "cpu_ms_per_event": per_unit(cpu, count),
        "simulator_cpu_share": round((sim_after["cpu_seconds"] - sim_before["cpu_seconds"]) / max(finished - started, 1e-6), 3),
    }


def baseline(ctx: Context) -> tuple[float, dict[str, float]]:
    """The bare DRF insert (B1's baseline view) measured right before and right after a run: req/s
    and CPU per request.

    Measured next to each run rather than taken from B1 minutes earlier: on a shared machine the
    speed drifts by ±30 % between scenarios, and a ratio must compare like with like. Even within
    one run it drifted by up to 30 % between two minutes, so a run is compared with the mean of the
    baselines on both sides of it."""
    from ..loadgen import post_load
    from .b1_accept import BASELINE_PATH, send_body

    with ctx.cpu(servers=True) as cpu:
        result = post_load(ctx.stack.web_url + BASELINE_PATH, send_body("+5511970000000"), ctx.sizes.b1_connections,
                           ctx.sizes.b1_seconds)
    return result.rate, per_unit(cpu, result.requests)


def run(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    runs: list[dict[str, Any]] = []
    with ctx.cpu() as meter:
        for n in range(sizes.b5_runs):
            ctx.fresh()
            before, base_cpu = baseline(ctx)
            runs.append(one_run(ctx, sizes.b5_events))
            after, _ = baseline(ctx)
            r = runs[-1]
            r["baseline_rate"], r["cpu_ms_per_bare_insert"] = round((before + after) / 2, 1), base_cpu
            r["baseline_before_after"] = [round(before, 1), round(after, 1)]
            ctx.log(f"  B5 run {n + 1}: bare insert {before:.0f}/s, then {r['rate']:.0f} events/s, then bare insert "
                    f"{after:.0f}/s; inbox {r['inbox_rows']} rows, {r['messages_delivered']} delivered (sim CPU "
                    f"{r['simulator_cpu_share']:.0%} of one core)")
    ctx.fresh()
    rate = Spread.of([r["rate"] for r in runs])
    base = Spread.of([r["baseline_rate"] for r in runs])
    correct = all(r["inbox_rows"] == r["events"] and r["inbox_processed"] == r["events"]
                  and r["messages_delivered"] == r["events"] for r in runs)
    ratio = rate.median / base.median if base.median else float("nan")
    return {
        "events": sizes.b5_events,
        "rate": rate.as_dict(),
        "baseline_rate": base.median,
        "baseline": base.as_dict(),
        "ratio": ratio,
        "correct": correct,
        "target": {"ratio": 0.5},
        "met": ratio >= 0.5 and correct,
        "runs": runs,
        "cpu": cpu_summary(meter),
    }
