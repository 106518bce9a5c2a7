"""B2: pipeline throughput (accepted → SENT at the simulator → READ) against trivial Celery tasks.

The messages are created with the bulk accept path (bench.backlog) split evenly over the three
lanes and round-robin over project A's fleet of instances (so that per-instance pacing is not the
limit being measured); the clock starts at the commit. The baseline publishes as many trivial tasks (one Redis INCR
each) over the same three queues to the same lane workers. Peak RSS per process kind is sampled
meanwhile (figure M).
"""

from __future__ import annotations

import time
from typing import Any

from ..backlog import bulk_accept, live_key
from ..context import Context, cpu_summary, per_unit, wait_for
from ..launcher import LANES
from ..procstats import Sampler
from ..stats import Spread, ratio
from .b2_otp_neighbour import beside, summary

CATEGORIES = ("OTP", "UTILITY", "MARKETING")


def baseline(ctx: Context, count: int) -> float:
    """Trivial tasks per second, publish of the first to the run of the last."""
    from bench.baseline.tasks import BASELINE_TASK, COUNTER_KEY
    from bench.celery_app import app
    from pilot_status.metrics import redis

    client = redis()
    client.delete(COUNTER_KEY)
    started = time.time()
    with app.producer_or_acquire() as producer:
        for i in range(count):
            lane = LANES[i % len(LANES)]
            app.send_task(BASELINE_TASK, queue=lane, routing_key=lane, producer=producer)
    met, _ = wait_for(lambda: int(client.get(COUNTER_KEY) or 0) >= count, ctx.sizes.wait_timeout, 0.05)
    elapsed = time.time() - started
    return count / elapsed if met else float("nan")


def _progress(ids: list[str]) -> dict[str, Any]:
    from django.db.models import Count, Max, Q

    from messaging.models import Message

    return Message.objects.filter(pk__in=ids).aggregate(
        sent=Count("pk", filter=Q(sent_at__isnull=False)),
        read=Count("pk", filter=Q(status="READ")),
        failed=Count("pk", filter=Q(status="FAILED")),
        last_sent=Max("sent_at"),
        last_read=Max("read_at"),
    )


def pipeline(ctx: Context, count: int, receipts: bool = True) -> dict[str, Any]:
    """One run from the bulk accept to all SENT, then to all READ (without receipts: to all SENT only;
    the caller has turned the simulator's webhooks and RabbitMQ events off). The caller starts it fresh."""
    world = ctx.world
    ids: list[str] = []
    per_lane = [count // 3 + (1 if i < count % 3 else 0) for i in range(3)]
    # Inserted unseen (one transaction per lane): the relay wakes on each commit's NOTIFY.
    started = time.time()
    for category, n in zip(CATEGORIES, per_lane):
        # Spread over A's fleet: one instance is paced far below the machine (SEND_RATE_PER_INSTANCE).
        # At issue 7's 20,000 a third are OTPs, more than their lane sends within an OTP's default
        # 2 minutes while the receipts of the rest take the machine: with the longest deliverUntil a
        # client may ask for, every message is a send, never an expiry.
        ids += bulk_accept(world.a.project, live_key(world.a.project), world.a.recipients, n, category,
                           instances=[i.name for i in world.fleet], longest_ttl=True)
    t0 = time.time()
    sent_all, progress = wait_for(lambda: (p := _progress(ids))["sent"] + p["failed"] >= count and p,
                                  ctx.sizes.wait_timeout, 0.5)
    read_all = False
    if receipts:
        read_all, progress = wait_for(lambda: (p := _progress(ids))["read"] + p["failed"] >= count and p,
                                      ctx.sizes.wait_timeout, 0.5)
    progress = _progress(ids)
    sim = ctx.sim.stats()
    sent_span = progress["last_sent"].timestamp() - t0 if progress["last_sent"] else float("nan")
    read_span = progress["last_read"].timestamp() - t0 if progress["last_read"] else float("nan")
    return {
        "messages": count,
        "insert_s": round(t0 - started, 2),
        "sent": progress["sent"], "read": progress["read"], "failed": progress["failed"],
        "all_sent": sent_all, "all_read": read_all,
        "sent_rate": progress["sent"] / sent_span if sent_all and sent_span > 0 else float("nan"),
        "read_rate": progress["read"] / read_span if read_all and read_span > 0 else float("nan"),
        "sent_s": round(sent_span, 2), "read_s": round(read_span, 2),
        "simulator_send_text": sim["send_text"],
        "simulator_webhooks": sim["webhook"], "simulator_rabbitmq": sim["rabbitmq"],
    }


def run(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    count = sizes.b2_messages
    baselines: list[float] = []
    runs: list[dict[str, Any]] = []
    beside_runs: list[dict[str, Any]] = []
    sampler = Sampler(ctx.roots())
    with ctx.cpu() as meter:
        for n in range(sizes.b2_runs):
            with ctx.cpu(servers=True) as base_cpu:
                baselines.append(baseline(ctx, count))
            ctx.fresh()
            sim_cpu = ctx.sim.stats()["cpu_seconds"]
            with sampler if n == 0 else _Nothing(), ctx.cpu(servers=True) as pipe_cpu:
                t = time.monotonic()
                result = pipeline(ctx, count)
                result["simulator_cpu_share"] = round((ctx.sim.stats()["cpu_seconds"] - sim_cpu) / (time.monotonic() - t), 3)
            # Where each unit of work costs CPU, whole machine: a message from accept to READ
            # (sends, receipts on both channels, relay, servers) against one trivial task.
            result["cpu_ms_per_task"] = per_unit(base_cpu, count)
            result["cpu_ms_per_message"] = per_unit(pipe_cpu, count)
            runs.append(result)
            ctx.log(f"  B2 run {n + 1}: baseline {baselines[-1]:.0f} tasks/s, SENT {result['sent_rate']:.0f}/s, "
                    f"READ {result['read_rate']:.0f}/s (sim CPU {result['simulator_cpu_share']:.0%} of one core)")
            if sizes.b2_otp_rate > 0:
                pair = beside(ctx, count, sizes.b2_otp_rate, result, pipeline)
                beside_runs.append(pair)
                ctx.log(f"  B2 run {n + 1} with {sizes.b2_otp_rate:g} OTP/s of project B alongside: SENT "
                        f"{pair['sent_rate']:.0f}/s, {pair['ratio']:.2f}x alone; the OTPs took "
                        f"{pair['otp_cpu_share']:.0%} of the machine alone ({pair['otp_cpu_ms']:.0f} ms each), "
                        f"kept {pair['kept_of_left']:.2f}x of what they left; OTP p99 {pair['otp_p99_ms']:.0f} ms")
    sends_alone = send_path_alone(ctx, count, baselines[-1])
    ctx.log(f"  B2 sends alone (no receipts): SENT {sends_alone['sent_rate']:.0f}/s, "
            f"{sends_alone['ratio']:.2f}x the last baseline")
    ctx.fresh()
    base = Spread.of(baselines)
    sent = Spread.of([r["sent_rate"] for r in runs])
    read = Spread.of([r["read_rate"] for r in runs])
    rss = {kind: round(mb, 1) for kind, mb in sampler.peak.items()}
    return {
        "messages": count,
        "baseline_tasks_per_s": base.as_dict(),
        "sent_rate": sent.as_dict(),
        "read_rate": read.as_dict(),
        "ratio": ratio(sent.median, base.median),
        "target": {"ratio": 0.35},
        "met": ratio(sent.median, base.median) >= 0.35 and all(r["all_sent"] for r in runs),
        "runs": runs,
        "sends_alone": sends_alone,
        # Issue 25 §3: another tenant's OTPs alongside, each pair taken seconds apart.
        "with_otps": summary(sizes.b2_otp_rate, beside_runs, sizes.b2_otp_alone_seconds) if beside_runs else None,
        "peak_rss_mb": rss,
        "rss_target_mb": {"worker": 150, "web": 120, "webhook": 120},
        # The webhook pool is a web process too (same WSGI app, another gunicorn).
        "rss_met": rss.get("worker", 0) <= 150 and max(rss.get("web", 0), rss.get("webhook", 0)) <= 120,
        "cpu": cpu_summary(meter),
    }


def send_path_alone(ctx: Context, count: int, baseline_rate: float) -> dict[str, Any]:
    """The send path's own ceiling: one more run with Evolution's receipts off (no webhook, no RabbitMQ
    event), so that only accept → relay → lane worker → sendText → SENT uses the machine. Not a figure
    of issue 7 (receipts are part of the pipeline): the arithmetic's measured upper bound for B2."""
    ctx.fresh()
    ctx.sim.set_global(rabbitmq_global=False)
    world = ctx.world
    for instance in (world.a.instance, world.b.instance, world.official, *world.fleet):
        ctx.sim.configure(instance.name, webhook={"enabled": False}, rabbitmq={"enabled": False})
    try:
        with ctx.cpu(servers=True) as cpu:
            result = pipeline(ctx, count, receipts=False)
    finally:
        ctx.sim.reset_global()
        ctx.fresh()
    return {
        "sent_rate": result["sent_rate"], "all_sent": result["all_sent"], "sent_s": result["sent_s"],
        "ratio": ratio(result["sent_rate"], baseline_rate),
        "cpu_ms_per_message": per_unit(cpu, count),
        "receipts_emitted": {"webhook": result["simulator_webhooks"].get("posted", 0),
                             "rabbitmq": result["simulator_rabbitmq"].get("published", 0)},
    }


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
