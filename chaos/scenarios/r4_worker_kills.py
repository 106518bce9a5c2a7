"""R4: the utility lane's worker SIGKILLed (its whole process group) again and again while a big
batch is sent. Nothing is lost, and the duplicate sendText calls Evolution receives for one message
stay within the number of kills (counted at the simulator's /_control/sends)."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from ..context import ACKS_DELIVERED, Context, Sent
from .common import accepted_ids, answers, duplicate_sends

FAULT = "worker-utility SIGKILLed {kills}× during {n} sends"
MUST = "0 lost; duplicate sendText calls for one message ≤ the number of kills"


def run(ctx: Context) -> dict[str, Any]:
    s = ctx.sizes
    ctx.fresh(ACKS_DELIVERED)
    out: list[Sent] = []
    sender = threading.Thread(target=lambda: out.extend(ctx.send_many(s.r4_messages, "r4")), daemon=True)
    sender.start()
    kills = 0
    kill_at_sends: list[int] = []
    deadline = time.monotonic() + max(300.0, s.r4_messages / 5)
    while kills < s.r4_kills and time.monotonic() < deadline:
        threshold = (kills + 1) * s.r4_messages // (s.r4_kills + 1)
        total = ctx.sim.stats()["send_text"]["total"]
        if total >= threshold:
            ctx.stack.restart("worker-utility", signal.SIGKILL)
            kills += 1
            kill_at_sends.append(total)
            ctx.log(f"  R4: kill {kills} at {total} sendText calls")
        time.sleep(0.2)
    sender.join()
    ids = accepted_ids(out)
    state = ctx.drain(ids)
    groups = ctx.sends_by_text()
    texts = {x.text for x in out if x.id}
    dup = duplicate_sends(groups, texts)
    worst = max((len(c) for t, c in groups.items() if t in texts), default=0)
    never_sent = sum(1 for t in texts if t not in groups)
    figures = {
        "sends": len(out),
        "answers": answers(out),
        "kills": kills,
        "kills_at_sendtext_total": kill_at_sends,
        "lost": state["lost"],
        "final": state["by_status"],
        "duplicate_sendtext_calls": dup["extra_calls"],
        "duplicate_accepted_sends": dup["extra_accepted_sends"],
        "most_calls_for_one_message": worst,
        "accepted_but_never_sent": never_sent,
        "drain_s": state["drain_s"],
    }
    passed = (len(ids) == len(out) and kills == s.r4_kills and state["lost"] == 0
              and dup["extra_calls"] <= kills and worst <= 1 + kills)
    return {"passed": passed, "fault": FAULT.format(kills=s.r4_kills, n=s.r4_messages), "must": MUST,
            "figures": figures, "notes": []}
