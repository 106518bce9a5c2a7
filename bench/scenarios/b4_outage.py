"""B4: the gateway is down for a while with messages queued, then comes back.

"Down" is the simulator answering every sendText of the chosen instances with 503 (what a proxy
in front of a dead Evolution answers). The messages are spread over a few of project A's instances
so that pacing is seen per instance. Measured: attempts consumed and gateway calls made during the
outage, the peak rate of gateway calls per instance after it (1-s and 5-s windows), and the drain
time. The baseline is the configured per-instance pacing cap (SEND_RATE_PER_INSTANCE, or the
instance's own send_rate_per_second) with its burst (SEND_RATE_BURST): over the judged 5-s window, at
most the cap plus a fifth of the burst.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings

from ..backlog import bulk_accept, live_key
from ..context import Context, cpu_summary


def pacing_cap(instance: Any) -> tuple[str | None, float | None, int | None]:
    """(where the cap comes from, sends/s, burst) — None when this build has no pacing."""
    own = getattr(instance, "send_rate_per_second", None)
    burst = getattr(settings, "SEND_RATE_BURST", None)
    if own:
        return f"{instance.name}.send_rate_per_second", float(own), burst
    if hasattr(settings, "SEND_RATE_PER_INSTANCE"):
        return "SEND_RATE_PER_INSTANCE", float(settings.SEND_RATE_PER_INSTANCE), burst
    return None, None, None


def _calls(ctx: Context, names: list[str]) -> dict[str, int]:
    return {name: int(ctx.sim.instance(name)["counters"]["send_text"]) for name in names}


def _rates(timeline: list[tuple[float, dict[str, int]]], since: float, window: int) -> float:
    """Highest calls/s of any one instance over `window` consecutive samples after `since`."""
    peak = 0.0
    for start in range(len(timeline) - window):
        (t0, c0), (t1, c1) = timeline[start], timeline[start + window]
        if t0 < since or t1 <= t0:
            continue
        peak = max(peak, max((c1[n] - c0[n]) / (t1 - t0) for n in c0))
    return peak


def run(ctx: Context) -> dict[str, Any]:
    from django.db.models import Count, Q, Sum

    from messaging.models import Message

    sizes = ctx.sizes
    world = ctx.world
    ctx.fresh()
    chosen = world.fleet[: sizes.b4_instances]
    names = [i.name for i in chosen]
    for name in names:
        ctx.sim.configure(name, faults={"error_rate": 1.0, "error_status": 503})
    with ctx.cpu() as meter:
        ids = bulk_accept(world.a.project, live_key(world.a.project), world.a.recipients, sizes.b4_messages, "UTILITY",
                          instances=names)
        down_at = time.monotonic()
        timeline: list[tuple[float, dict[str, int]]] = []
        while time.monotonic() - down_at < sizes.b4_outage_seconds:
            timeline.append((time.monotonic() - down_at, _calls(ctx, names)))
            time.sleep(1.0)
        calls_during = sum(_calls(ctx, names).values())
        attempts_during = Message.objects.filter(pk__in=ids).aggregate(n=Sum("attempts"))["n"] or 0
        for name in names:
            ctx.sim.configure(name, faults={"error_rate": 0.0})
        up_at = time.monotonic()
        drained = False
        while time.monotonic() - up_at < sizes.b4_drain_timeout:
            timeline.append((time.monotonic() - down_at, _calls(ctx, names)))
            done = Message.objects.filter(pk__in=ids).aggregate(
                n=Count("pk", filter=Q(sent_at__isnull=False) | Q(status="FAILED")))["n"]
            if done >= len(ids):
                drained = True
                break
            time.sleep(1.0)
        drain_s = time.monotonic() - up_at
    outcome = dict(Message.objects.filter(pk__in=ids).values_list("status").annotate(n=Count("pk")))
    attempts_total = Message.objects.filter(pk__in=ids).aggregate(n=Sum("attempts"))["n"] or 0
    after = sizes.b4_outage_seconds
    peak_1s = _rates(timeline, after, 1)
    peak_5s = _rates(timeline, after, 5) if len(timeline) > 6 else peak_1s
    totals = [(round(t), sum(c.values())) for t, c in timeline]
    per_second = [(t1, round((c1 - c0) / max(t1 - t0, 1), 1)) for (t0, c0), (t1, c1) in zip(totals, totals[1:])]
    source, cap, burst = pacing_cap(chosen[0])
    # What the bucket lets through in any 5 s: the cap, plus its burst once (tokens saved up during
    # the outage). The 2 % covers the sampler: counts and clock are read a few ms apart.
    ceiling_5s = cap + (burst or 0) / 5 if cap is not None else None
    ctx.fresh()
    return {
        "messages": sizes.b4_messages,
        "instances": len(names),
        "outage_s": sizes.b4_outage_seconds,
        "gateway_calls_during_outage": calls_during,
        "attempts_consumed_during_outage": attempts_during,
        "attempts_total": attempts_total,
        "peak_calls_per_s_after": round(peak_5s, 1),
        "peak_calls_per_s_after_1s": round(peak_1s, 1),
        "drain_s": round(drain_s, 1),
        "drained": drained,
        "final_statuses": outcome,
        "pacing_cap_setting": source,
        "pacing_cap_per_s": cap,
        "pacing_burst": burst,
        "calls_per_s_timeline": per_second,
        "ceiling_5s": ceiling_5s,
        "met": (ceiling_5s is not None and peak_5s <= ceiling_5s * 1.02 and attempts_during <= 0.01 * sizes.b4_messages
                and drained),
        "measurable": cap is not None,
        "cpu": cpu_summary(meter),
    }
