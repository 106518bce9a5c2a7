"""B6: fairness inside the marketing lane: project A queues a big blast, project B a little later.

Both backlogs are created with the bulk accept path (this is about draining). A is a big customer
with many numbers (its fleet); B sends through its one instance, paced at SEND_RATE_PER_INSTANCE,
which bounds "B alone". B's wait per message
= sent_at - created_at. Compared with B's messages queued alone. B's messages not sent within the
timeout count as an infinite wait, so a p99 past the timeout is reported as "> timeout".
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..backlog import bulk_accept, live_key
from ..context import Context, cpu_summary, wait_for
from ..stats import Spread, percentile


def b_waits(ctx: Context, ids: list[str], timeout: float) -> dict[str, Any]:
    from messaging.models import Message

    met, _ = wait_for(lambda: Message.objects.filter(pk__in=ids, sent_at__isnull=False).count() >= len(ids), timeout, 0.25)
    rows = Message.objects.filter(pk__in=ids).values_list("created_at", "sent_at")
    waits = [(sent - created).total_seconds() if sent else math.inf for created, sent in rows]
    return {"count": len(waits), "sent": sum(1 for w in waits if w != math.inf), "all_sent": met,
            "p50_s": percentile(waits, 50), "p99_s": percentile(waits, 99)}


def one_run(ctx: Context, backlog: int) -> dict[str, Any]:
    from messaging.models import Message

    sizes = ctx.sizes
    world = ctx.world
    ctx.fresh()
    if backlog:
        bulk_accept(world.a.project, live_key(world.a.project), world.a.recipients, backlog, "MARKETING",
                    instances=[i.name for i in world.fleet])
        time.sleep(sizes.b6_delay_seconds)
    ids = bulk_accept(world.b.project, live_key(world.b.project), world.b.recipients, sizes.b6_b_messages, "MARKETING")
    result = b_waits(ctx, ids, sizes.b6_timeout)
    if backlog:
        result["a_sent_meanwhile"] = Message.objects.filter(project=world.a.project, sent_at__isnull=False).count()
    return result


def _finite(value: float) -> float:
    return value if value != math.inf else math.nan


def run(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    alone: list[dict[str, Any]] = []
    behind: list[dict[str, Any]] = []
    with ctx.cpu() as meter:
        for n in range(sizes.b6_runs):
            alone.append(one_run(ctx, 0))
            behind.append(one_run(ctx, sizes.b6_backlog))
            ctx.log(f"  B6 run {n + 1}: B alone p99 {alone[-1]['p99_s']:.2f} s, behind A p99 {behind[-1]['p99_s']:.2f} s "
                    f"({behind[-1]['sent']}/{behind[-1]['count']} of B sent, {behind[-1].get('a_sent_meanwhile', 0)} of A)")
    ctx.fresh()
    alone_p99 = Spread.of([r["p99_s"] for r in alone])
    behind_runs = [r["p99_s"] for r in behind]
    timed_out = any(v == math.inf for v in behind_runs)
    behind_p99 = Spread.of([_finite(v) for v in behind_runs]) if not timed_out else Spread(math.inf, math.inf, math.inf, behind_runs)
    ratio = behind_p99.median / alone_p99.median if alone_p99.median else math.nan
    return {
        "backlog": sizes.b6_backlog, "b_messages": sizes.b6_b_messages, "timeout_s": sizes.b6_timeout,
        "alone": {"p99_s": alone_p99.as_dict(), "runs": alone},
        "behind": {"p99_s": behind_p99.as_dict(), "runs": behind, "timed_out": timed_out},
        "ratio": ratio,
        "target": {"ratio": 2.0},
        "met": (not timed_out) and ratio <= 2.0,
        "cpu": cpu_summary(meter),
    }
