"""R7: the relay SIGKILLed while it releases a batch, the RabbitMQ consumer SIGKILLed while it
ingests receipts; both restarted. Nothing lost, nothing processed twice: one accepted sendText per
message at the simulator and no status applied twice on any message's timeline."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from django.db.models import Count

from ..context import ACKS_READ, Context, Sent, wait_for
from .common import accepted_ids, answers, duplicate_sends

FAULT = "relay and consumer SIGKILLed {kills}× each mid-batch ({n} sends, receipts on both channels)"
MUST = "nothing lost, nothing processed twice"


def run(ctx: Context) -> dict[str, Any]:
    from ingestion.models import IngestionEvent
    from messaging.models import MessageEvent

    s = ctx.sizes
    ctx.fresh(ACKS_READ)
    out: list[Sent] = []
    sender = threading.Thread(target=lambda: out.extend(ctx.send_many(s.r7_messages, "r7")), daemon=True)
    sender.start()
    kills = {"relay": 0, "consumer": 0}
    for k in range(s.r7_kills):
        threshold = (k + 1) * s.r7_messages // (s.r7_kills + 2)
        wait_for(lambda: ctx.sim.stats()["send_text"]["total"] >= threshold, timeout=180, interval=0.1)
        ctx.stack.restart("relay", signal.SIGKILL)
        kills["relay"] += 1
        # The consumer mid-ingestion: once it has stored receipts since the last kill.
        seen = IngestionEvent.objects.filter(channel="RABBITMQ").count()
        wait_for(lambda: IngestionEvent.objects.filter(channel="RABBITMQ").count() > seen + 5, timeout=60, interval=0.1)
        ctx.stack.restart("consumer", signal.SIGKILL)
        kills["consumer"] += 1
        time.sleep(1.0)
    sender.join()
    ids = accepted_ids(out)
    state = ctx.drain(ids)
    # READ is the last receipt: wait for it too (DELIVERED already counts as final for the drain).
    with ctx.maintenance():
        wait_for(lambda: state["by_status"].get("READ", 0) >= len(ids) or
                 _reads(ids) >= len(ids), timeout=60, interval=1.0)
    final = ctx.final_state(ids)
    dup = duplicate_sends(ctx.sends_by_text(), {x.text for x in out if x.id})
    twice = (MessageEvent.objects.filter(message_id__in=ids, kind="STATUS")
             .values("message_id", "detail__status").annotate(n=Count("id")).filter(n__gt=1).count())
    figures = {"sends": len(out), "answers": answers(out), "kills": kills, "lost": final["lost"],
               "final": final["by_status"], "duplicate_sendtext_calls": dup["extra_calls"],
               "duplicate_accepted_sends": dup["extra_accepted_sends"], "statuses_applied_twice": twice,
               "inbox_rows_by_channel": dict(IngestionEvent.objects.values_list("channel").annotate(n=Count("id")))}
    passed = (len(ids) == len(out) and final["lost"] == 0 and dup["extra_accepted_sends"] == 0 and twice == 0
              and final["by_status"].get("READ", 0) == len(ids))
    return {"passed": passed, "fault": FAULT.format(kills=s.r7_kills, n=s.r7_messages), "must": MUST,
            "figures": figures, "notes": []}


def _reads(ids: list[str]) -> int:
    from messaging.models import Message

    return Message.objects.filter(pk__in=ids, status="READ").count()
