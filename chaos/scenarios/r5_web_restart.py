"""R5: web (gunicorn) SIGKILLed and restarted while Evolution's receipts pour in. No ghost status:
every message ends in the status Evolution last reported for it (READ on half the fleet, DELIVERED on
the other half), carried by the RabbitMQ channel, the webhook retries and the status sync."""

from __future__ import annotations

import signal
import time
from typing import Any

from ..context import Context, Sent, wait_for
from .common import accepted_ids, answers

FAULT = "web SIGKILLed and restarted {restarts}× during the receipts of {n} sends"
MUST = "0 ghost statuses: every message ends in its true status"
STORM_READ = {"SERVER_ACK": 500, "DELIVERY_ACK": 2000, "READ": 2500}
STORM_DELIVERED = {"SERVER_ACK": 500, "DELIVERY_ACK": 2000, "READ": None}


def run(ctx: Context) -> dict[str, Any]:
    from messaging.models import Message

    s = ctx.sizes
    ctx.fresh()
    reads, delivers = ctx.world.a.fleet[:4], ctx.world.a.fleet[4:]
    for inst in reads:
        ctx.register(inst, STORM_READ)
    for inst in delivers:
        ctx.register(inst, STORM_DELIVERED)
    truth = {inst.name: ("READ" if inst in reads else "DELIVERED") for inst in ctx.world.a.fleet}
    # Every send is accepted first (a client cannot send to a dead web either); the receipts, due
    # 0.5 s to 4.5 s later, are the storm the restarts land in.
    out: list[Sent] = ctx.send_many(s.r5_messages, "r5")
    restarts = 0
    for _ in range(s.r5_restarts):
        ctx.stack.restart("web", signal.SIGKILL)
        restarts += 1
        time.sleep(1.0)
    ids = accepted_ids(out)

    def ghosts() -> list[tuple[str, str, str]]:
        rows = Message.objects.filter(pk__in=ids).values_list("pk", "instance__name", "status")
        return [(str(pk), name, st) for pk, name, st in rows if st != truth.get(name)]

    with ctx.maintenance():
        wait_for(lambda: not ghosts(), timeout=s.drain_s, interval=1.0)
    remaining = ghosts()
    stats = ctx.sim.stats()["webhook"]
    figures = {
        "sends": len(out), "answers": answers(out), "web_restarts": restarts,
        "webhook_posts": stats.get("posted"), "webhook_failed": stats.get("failed"), "webhook_retried": stats.get("retried"),
        "ghost_statuses": len(remaining),
        "ghost_examples": remaining[:5],
        "final": _by_status(ids),
    }
    passed = len(ids) == len(out) and restarts == s.r5_restarts and not remaining
    return {"passed": passed, "fault": FAULT.format(restarts=s.r5_restarts, n=s.r5_messages), "must": MUST,
            "figures": figures, "notes": []}


def _by_status(ids: list[str]) -> dict[str, int]:
    from django.db.models import Count

    from messaging.models import Message

    return {r["status"]: r["n"] for r in Message.objects.filter(pk__in=ids).values("status").annotate(n=Count("pk"))}
