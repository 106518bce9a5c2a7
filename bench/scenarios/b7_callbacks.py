"""B7: callback deliveries per second against the trivial Celery task baseline, with the CPU per delivery (issue 23).

Each run measures the baseline first (B2's `baseline`: trivial tasks on the lane workers, same broker, same run).
Then, from fresh tables, project A gets a `message.status` endpoint at a receiver in the bench process
(bench.callbacks_on) with the callbacks relay pass not ticking yet, and B2's `pipeline` takes `b7_messages` from the
bulk accept (a third per lane, round-robin over A's fleet) to all READ: every status change (SENT, DELIVERED,
READ, ...) is a timeline line that owes one callback. Then the relay pass ticks every CALLBACKS_RELAY_SECONDS, as
beat's entry does, and the deliveries owed drain: each pass writes them from the timeline and hands out at most
`callbacks.deliver.RELEASE_BATCH`; the callbacks worker claims, signs, posts and records each one.

So the figure is the callbacks path's own rate, from a backlog, as after a receiver's outage (chaos R9), not the
pace at which the pipeline makes status changes: with the relay ticking during the pipeline the receiver would
only follow the receipts (B3 runs callbacks on alongside its OTPs for that). The rate is taken at the receiver over
the steady window: between the arrivals of the first and last STEADY_TRIM of the deliveries, so the first pass's
ramp and the tail are left out; first-to-last and from-the-first-tick rates are kept beside it. The CPU meter runs
from the first tick to the last arrival (servers included).
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..callbacks_on import Receiver, RelayTicker, callbacks_on
from ..context import Context, cpu_summary, per_unit, wait_for
from ..stats import Spread, ratio
from .b2_pipeline import baseline, pipeline

# The share of the deliveries left out at each end of the steady window: the first pass (its derivation of the
# whole backlog's first batches before the first release) and the tail (the last, partly filled pass).
STEADY_TRIM = 0.1
# After the pipeline's last READ, before the first tick: the slower channel's copies of the last receipts are
# still being handled (and skipped); let them pass so that the meter holds the callbacks' work, not theirs.
QUIET_SECONDS = 3.0
ATTEMPTS_SETTLE_SECONDS = 5.0


def rates(arrivals: list[float], started: float, trim: float = STEADY_TRIM) -> dict[str, float]:
    """Deliveries per second at the receiver from the arrival times (epoch seconds): `steady` between the
    arrivals at ranks trim·n and (1 − trim)·n (intervals over their span), `first_to_last` over every arrival,
    `from_start` from `started` (the first relay tick) to the last arrival, the first derivation included.
    A rate that has no span to be taken over is NaN."""
    ordered = sorted(arrivals)
    n = len(ordered)
    low, high = int(n * trim), n - 1 - int(n * trim)
    if high <= low:  # too few arrivals to leave any out
        low, high = 0, n - 1

    def per_second(intervals: int, span: float) -> float:
        return intervals / span if intervals > 0 and span > 0 else math.nan

    return {
        "steady": per_second(high - low, ordered[high] - ordered[low]) if n else math.nan,
        "first_to_last": per_second(n - 1, ordered[-1] - ordered[0]) if n else math.nan,
        "from_start": per_second(n, ordered[-1] - started) if n else math.nan,
        "steady_count": max(0, high - low + 1),
        "steady_s": round(ordered[high] - ordered[low], 3) if n else math.nan,
    }


def concurrency(argv: list[str]) -> str:
    """A Celery worker's `-c` (the callbacks worker's threads, as the stack started it), or "?" without one."""
    return argv[argv.index("-c") + 1] if "-c" in argv[:-1] else "?"


def status_changes(project: Any) -> int:
    """The callbacks owed to a `message.status` endpoint of `project`: its messages' status lines."""
    from callbacks.derive_events import STATUS_KINDS
    from messaging.models import MessageEvent

    return MessageEvent.objects.filter(kind__in=STATUS_KINDS, message__project=project).count()


def written(endpoint: Any) -> dict[str, int]:
    """What the product recorded for the endpoint: deliveries written, succeeded, and every attempt."""
    from django.db.models import Count, Q

    from callbacks.models import Delivery, DeliveryAttempt, DeliveryStatus

    counts = Delivery.objects.filter(endpoint=endpoint).aggregate(
        written=Count("pk"), succeeded=Count("pk", filter=Q(status=DeliveryStatus.SUCCEEDED)),
        failed=Count("pk", filter=Q(status=DeliveryStatus.FAILED)))
    attempts = DeliveryAttempt.objects.filter(delivery__endpoint=endpoint).aggregate(
        attempts=Count("pk"), failed_attempts=Count("pk", filter=Q(succeeded=False)))
    return {**counts, **attempts}


def drain(ctx: Context, receiver: Receiver, owed: int) -> dict[str, Any]:
    """Tick the relay pass until the receiver has `owed` callbacks (or the wait times out); CPU metered."""
    from django.conf import settings

    with ctx.cpu(servers=True) as meter:
        started = time.time()
        ticker = RelayTicker(float(settings.CALLBACKS_RELAY_SECONDS)).start()
        try:
            done, _ = wait_for(lambda: receiver.snapshot().received >= owed, ctx.sizes.wait_timeout, 0.1)
        finally:
            ticker.stop()
    arrivals = receiver.arrivals()
    tally = receiver.snapshot()
    return {"all_delivered": done, "owed": owed, "received": tally.received, "duplicates": tally.duplicates,
            "signatures_checked": tally.verified + tally.bad_signatures, "bad_signatures": tally.bad_signatures,
            "relay_ticks": ticker.published, "rates": rates(arrivals, started),
            "cpu_s": {kind: round(seconds, 2) for kind, seconds in sorted(meter.by_kind.items())},
            "machine_cpu_s": round(meter.machine_busy, 2),
            "cpu_ms_per_delivery": per_unit(meter, tally.received), "cpu": cpu_summary(meter)}


def one_run(ctx: Context, receiver: Receiver) -> dict[str, Any]:
    count = ctx.sizes.b7_messages
    with ctx.cpu(servers=True) as base_cpu:
        tasks_per_s = baseline(ctx, count)
    ctx.fresh()
    project = ctx.world.a.project
    with callbacks_on(project, receiver, relay=False, description="bench B7") as endpoint:
        piped = pipeline(ctx, count)
        time.sleep(QUIET_SECONDS)
        owed = status_changes(project)
        result = drain(ctx, receiver, owed)
        # The worker records an attempt just after the receiver has answered: the last few are written a
        # moment after the last arrival (not measured; a few seconds at most).
        wait_for(lambda: written(endpoint)["attempts"] >= result["received"], ATTEMPTS_SETTLE_SECONDS, 0.2)
        result["deliveries"] = written(endpoint)
    result.update(baseline_tasks_per_s=tasks_per_s, cpu_ms_per_task=per_unit(base_cpu, count),
                  messages=count, all_read=piped["all_read"], read=piped["read"], failed=piped["failed"])
    return result


def run(ctx: Context) -> dict[str, Any]:
    from django.conf import settings

    from callbacks.deliver import RELEASE_BATCH

    runs: list[dict[str, Any]] = []
    receiver = Receiver()
    try:
        for n in range(ctx.sizes.b7_runs):
            runs.append(r := one_run(ctx, receiver))
            d = r["deliveries"]
            ctx.log(f"  B7 run {n + 1}: baseline {r['baseline_tasks_per_s']:.0f} tasks/s; {r['received']:,} of "
                    f"{r['owed']:,} callbacks received ({d['written']:,} written, {d['attempts']:,} attempts), steady "
                    f"{r['rates']['steady']:.0f}/s (first to last {r['rates']['first_to_last']:.0f}/s); CPU per "
                    f"delivery: callbacks worker {r['cpu_ms_per_delivery'].get('callbacks', math.nan):.2f} ms, "
                    f"machine {r['cpu_ms_per_delivery'].get('machine', math.nan):.2f} ms")
    finally:
        receiver.stop()
    ctx.fresh()
    steady = Spread.of([r["rates"]["steady"] for r in runs])
    base = Spread.of([r["baseline_tasks_per_s"] for r in runs])
    return {
        "messages": ctx.sizes.b7_messages,
        "deliveries_per_s": steady.as_dict(),
        "first_to_last_per_s": Spread.of([r["rates"]["first_to_last"] for r in runs]).as_dict(),
        "baseline_tasks_per_s": base.as_dict(),
        "ratio": ratio(steady.median, base.median),
        "steady_trim": STEADY_TRIM,
        # At most RELEASE_BATCH deliveries are handed out per relay pass, one pass per tick: the callbacks
        # path's own ceiling, against which the rate can be read.
        "release_ceiling_per_s": RELEASE_BATCH / float(settings.CALLBACKS_RELAY_SECONDS),
        "callbacks_worker_threads": concurrency(ctx.stack.processes["worker-callbacks"].argv),
        # No figure is named for B7 in issue 23: reported, not judged.
        "target": None,
        "met": None,
        "all_delivered": all(r["all_delivered"] and r["received"] == r["owed"] == r["deliveries"]["written"]
                             and not r["bad_signatures"] for r in runs),
        "runs": runs,
        "cpu": runs[0]["cpu"] if runs else {},
    }
