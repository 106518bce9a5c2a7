"""R1: Redis stopped under a steady send load. Every valid send gets 202, nothing is lost, and all
is delivered once Redis is back (the accept path never touches Redis: docs/architecture.md, principle 1)."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.support.services import stopped

from ..context import ACKS_DELIVERED, Context, Sent
from .common import accepted_ids, answers

FAULT = "Redis stopped {outage}s under {rate}/s sends"
MUST = "100 % of valid sends get 202; 0 lost; all delivered after Redis returns"


def run(ctx: Context) -> dict[str, Any]:
    s = ctx.sizes
    ctx.fresh(ACKS_DELIVERED)
    out: list[Sent] = []
    stop = threading.Event()
    load = ctx.steady_load(s.r1_rate, stop, "r1", out)
    time.sleep(2)
    down_at = up_at = 0.0
    try:
        with stopped("redis"):
            down_at = time.monotonic()
            time.sleep(s.r1_outage_s)
            up_at = time.monotonic()
        time.sleep(2)
    finally:
        stop.set()
        load.join(60)
    ids = accepted_ids(out)
    during = [x for x in out if down_at <= x.at <= up_at]
    state = ctx.drain(ids)
    figures = {
        "sends": len(out),
        "sends_while_redis_down": len(during),
        "answers": answers(out),
        "accepted_share": round(len(ids) / len(out), 4) if out else 0,
        "lost": state["lost"],
        "final": state["by_status"],
        "drain_s": state["drain_s"],
    }
    delivered = sum(v for k, v in state["by_status"].items() if k in ("DELIVERED", "READ"))
    passed = bool(out) and len(ids) == len(out) and state["lost"] == 0 and delivered == len(ids) and bool(during)
    return {"passed": passed, "fault": FAULT.format(outage=s.r1_outage_s, rate=s.r1_rate), "must": MUST,
            "figures": figures, "notes": []}
