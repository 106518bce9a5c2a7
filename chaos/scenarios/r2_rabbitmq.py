"""R2: RabbitMQ stopped. The API keeps accepting; the relay and the consumer reconnect on their own
(same processes before and after); statuses keep arriving over the webhook channel while the broker
is down; nothing is lost."""

from __future__ import annotations

import threading
import time
from typing import Any

from django.utils import timezone

from tests.support.processes import log_size
from tests.support.services import stopped

from ..context import ACKS_DELIVERED, Context, Sent, wait_for
from .common import accepted_ids, answers, pids

FAULT = "RabbitMQ stopped {outage}s under {rate}/s sends, receipts of {inflight} earlier sends due during it"
MUST = "the API keeps accepting; relay and consumer reconnect alone; webhook statuses keep flowing; 0 lost"


def run(ctx: Context) -> dict[str, Any]:
    from messaging.models import Message, MessageEvent

    s = ctx.sizes
    ctx.fresh(ACKS_DELIVERED)
    slow, steady = ctx.world.a.fleet[:4], ctx.world.a.fleet[4:]
    inflight = ctx.send_many(s.r2_inflight, "r2-inflight", instances=slow)
    inflight_ids = accepted_ids(inflight)
    wait_for(lambda: Message.objects.filter(pk__in=inflight_ids, status__in=["DELIVERED", "READ"]).count()
             == len(inflight_ids), timeout=60)
    before = pids(ctx.stack)
    consumer_log = ctx.stack.processes["consumer"].log
    consumer_offset = log_size(consumer_log)

    out: list[Sent] = []
    stop = threading.Event()
    load = ctx.steady_load(s.r2_rate, stop, "r2", out, pool=steady)
    down_at = up_at = 0.0
    try:
        with stopped("rabbitmq"):
            down_at, down_ts = time.monotonic(), timezone.now()
            # The phones read the earlier messages now: Evolution emits READ on every channel, and
            # only the webhook can carry it while the broker is down.
            emit_reads(ctx, inflight_ids)
            time.sleep(max(0.0, s.r2_outage_s - (time.monotonic() - down_at)))
            up_at, up_ts = time.monotonic(), timezone.now()
        time.sleep(2)
    finally:
        stop.set()
        load.join(60)
    ids = accepted_ids(out) + inflight_ids
    statuses_during = MessageEvent.objects.filter(kind="STATUS", created_at__gte=down_ts, created_at__lte=up_ts).count()
    reads_during = Message.objects.filter(pk__in=inflight_ids, read_at__gte=down_ts, read_at__lte=up_ts).count()
    state = ctx.drain(ids)
    reconnected, _ = wait_for(lambda: "Connected to amqp" in consumer_log.read_bytes()[consumer_offset:].decode(errors="replace"),
                              timeout=30)
    after = pids(ctx.stack)
    during = [x for x in out if down_at <= x.at <= up_at]
    figures = {
        "sends": len(out),
        "sends_while_rabbitmq_down": len(during),
        "answers": answers(out),
        "status_changes_applied_during_outage": statuses_during,
        "inflight_reads_during_outage": f"{reads_during}/{len(inflight_ids)}",
        "relay_consumer_same_process": before["relay"] == after["relay"] and before["consumer"] == after["consumer"],
        "consumer_reconnected": reconnected,
        "lost": state["lost"],
        "final": state["by_status"],
        "drain_s": state["drain_s"],
    }
    passed = (bool(during) and all(x.status == 202 for x in out) and statuses_during > 0
              and figures["relay_consumer_same_process"] and after["relay"] is not None and reconnected
              and state["lost"] == 0)
    return {"passed": passed, "fault": FAULT.format(outage=s.r2_outage_s, rate=s.r2_rate, inflight=s.r2_inflight),
            "must": MUST, "figures": figures, "notes": []}


def emit_reads(ctx: Context, ids: list[str]) -> None:
    from messaging.models import Message

    instance_ids: dict[str, str] = {}
    for m in Message.objects.filter(pk__in=ids).select_related("instance"):
        name = m.instance.name
        if name not in instance_ids:
            instance_ids[name] = ctx.sim.http.get(f"{ctx.sim.base_url}/_control/instances/{name}", timeout=10).json()["id"]
        ctx.sim.emit(name, "messages.update", {"keyId": m.evolution_message_id, "remoteJid": m.remote_jid,
                                               "fromMe": True, "status": "READ", "instanceId": instance_ids[name]})
