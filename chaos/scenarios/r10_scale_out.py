"""R10: scale-out. Two of every process docs/scaling.md calls scalable, side by side on one database and one
broker: two web pools, two webhook pools, two relays (both over every lane), two RabbitMQ consumers, two sets of
lane workers (otp, utility, marketing), two of each maintenance worker (maintenance, sync, bulk) and two
callbacks workers (distinct Celery node names), with beat running once; a second beat started meanwhile must be
refused (pilot_status.beat_lock: exit status 3, naming the first). The client's sends alternate between the two
web pools; half the instances send their webhooks to each webhook pool, and the second consumer forwards to the
second webhook pool (the first to web, which serves /api/internal/ too), so receipts arrive on both channels at
several pools. Project C's messages owe `message.status` callbacks to a receiver in the harness
(tests/support/receiver.py), which the two callbacks workers deliver, beat ticking the callbacks relay. Project
C's two batches are accepted with bench B6's bulk accept, A's blast through the two web pools.

Must show: 0 lost, 0 duplicate sendText (the simulator logs every call, one text per message), every callback
C's messages owe delivered with a valid signature, two consumers on every queue, the second beat refused, and
fairness between two projects as bench B6 measures it (docs/scaling.md): project C's p99 wait
(sent_at - created_at, MARKETING) while project A's blast is backlogged is at most twice C's p99 wait
alone, on the same two-of-everything stack. A's blast is accepted while both relays are stopped (they
start again right before C sends), so that C finds A's backlog in the outbox however fast a loaded host
accepts. A's instances are paced at `r10_a_rate` per second each; C's one instance at `r10_c_rate`, and C
sends more than the stack's burst (SEND_RATE_BURST), so that, as B's in B6, C's own pace bounds "C alone"
(with no pace to wait for, C alone is a fraction of a second and the ratio would measure the host's load).

The extra processes are started here (chaos/scenarios/r10_copies.py) with tests.support.processes.Process and
the topology's commands; they are stopped when the row ends, so the stack goes on as the single-copy
deployment for the next rows.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..context import ACKS_DELIVERED, Context, Sent, wait_for
from . import r10_copies
from .common import answers, duplicate_sends

FAULT = ("two of every scalable process (web and webhook pools, relays, consumers, lane worker sets, maintenance, "
         "sync, bulk and callbacks workers), one beat and a second one started; {n} sends, receipts on both channels")
MUST = ("0 lost; 0 duplicate sendText; 0 callbacks lost; two consumers on every queue; the second beat exits 3; "
        "C's p99 wait behind A's blast ≤ 2× C alone (B6)")
TARGET_RATIO = 2.0


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, math.ceil(pct / 100 * len(ordered)) - 1)
    return ordered[rank]


def queue_consumers() -> dict[str, int]:
    """Consumers RabbitMQ counts on each lane queue and on Evolution's ingest queue (two of each expected)."""
    from django.conf import settings
    from kombu import Connection

    from ingestion.consumer import queue_names
    from pilot_status.celery import LANES, app

    counts: dict[str, int] = {}
    with app.connection_for_write() as conn:
        for lane in LANES:
            channel: Any = conn.channel()
            try:
                counts[lane] = channel.queue_declare(lane, passive=True).consumer_count
            finally:
                channel.close()
    ingest = queue_names().work
    with Connection(settings.EVOLUTION_RABBITMQ_URL or settings.CELERY_BROKER_URL) as conn:
        channel = conn.channel()
        try:
            counts["ingest"] = channel.queue_declare(ingest, passive=True).consumer_count
        finally:
            channel.close()
    return counts


def relay_heartbeats() -> int:
    from pilot_status import heartbeats

    return sum(1 for beat in heartbeats.processes() if str(beat.get("process", "")).startswith("relay"))


def waits(ids: list[str], timeout: float) -> dict[str, Any]:
    """B6's measure: each message's sent_at - created_at; one never sent counts as an infinite wait."""
    from messaging.models import Message

    wait_for(lambda: Message.objects.filter(pk__in=ids, sent_at__isnull=False).count() >= len(ids), timeout, 0.25)
    rows = Message.objects.filter(pk__in=ids).values_list("created_at", "sent_at")
    values = [(sent - created).total_seconds() if sent else math.inf for created, sent in rows]
    return {"count": len(values), "sent": sum(1 for v in values if v != math.inf),
            "p50_s": round(_percentile(values, 50), 3), "p99_s": round(_percentile(values, 99), 3)}


def c_batch(tenant: Any, n: int, tag: str) -> list[str]:
    """n MARKETING messages of project C through its one instance, accepted at once (bench B6's bulk
    accept: the funnel's checks, then the rows and outbox entries in one transaction)."""
    from bench.backlog import bulk_accept, live_key

    return bulk_accept(tenant.project, live_key(tenant.project), tenant.recipients, n, "MARKETING",
                       text=tag + " {{n}}", instances=[tenant.instance.name])


def lane_task_errors(offsets: dict[Any, int]) -> dict[str, int]:
    """Send tasks that raised during the row, by exception text, from the lane workers' logs (a task that
    raises before its claim leaves its message to the reconciler: chaos/findings.md, 11)."""
    errors: Counter[str] = Counter()
    for log, start in offsets.items():
        with open(log, "rb") as handle:
            handle.seek(start)
            for line in handle.read().decode(errors="replace").splitlines():
                if "raised unexpected:" in line:
                    errors[line.split("raised unexpected:", 1)[1].strip()[:80]] += 1
    return dict(errors)


def send_alternating(ctx: Context, urls: list[str], n: int, tag: str, tenant: Any, pool: list[Any],
                     category: str, per_url: Counter[str]) -> list[Sent]:
    """n sends by `sizes.senders` threads, alternating between the web pools (per_url counts the 202s)."""
    lock = threading.Lock()

    def one(i: int) -> Sent:
        base = urls[i % len(urls)]
        result = _send_to(ctx, base, tenant.recipients[i % len(tenant.recipients)], f"{tag} #{i}", category,
                          pool[i % len(pool)].name, tenant.live_key)
        if result.status == 202:
            with lock:
                per_url[base] += 1
        return result

    with ThreadPoolExecutor(ctx.sizes.senders) as ex:
        return list(ex.map(one, range(n)))


def _send_to(ctx: Context, base: str, to: str, text: str, category: str, instance: str, key: str) -> Sent:
    return ctx.send(to, text, category, instance=instance, key=key, base=base)


def run(ctx: Context) -> dict[str, Any]:
    from django.db.models import Count

    from ingestion.models import IngestionEvent
    from messaging.models import Instance, Message
    from tests.support.processes import LANES, log_size, stop_all, wait_for_log
    from tests.support.receiver import Receiver

    s = ctx.sizes
    world = ctx.world
    a_instances = [world.a.instance, *world.a.fleet]
    started = r10_copies.start_copies(ctx)
    copies, web2_url, webhook_urls = started["processes"], started["web2_url"], started["webhook_urls"]
    lane_logs = [p.log for name, p in [*ctx.stack.processes.items(), *copies.items()]
                 if name.startswith(tuple(f"worker-{lane}" for lane in LANES))]
    urls = [ctx.stack.web_url, web2_url]
    secret: dict[str, str] = {}
    receiver = Receiver(lambda: secret.get("value", ""))
    receiver.set("ok")
    try:
        ctx.fresh(ACKS_DELIVERED)  # empties the callbacks tables too
        # The row's own tasks from here: a task of an earlier run still queued when the tables were emptied fails
        # against the emptied rows, and says nothing about this row.
        log_offsets = {log: log_size(log) for log in lane_logs}
        refused = r10_copies.second_beat(ctx)
        secret["value"] = r10_copies.create_endpoint(ctx, world.c, receiver.url)["secret"]
        # Half the instances post their webhooks to each webhook pool (ctx.fresh registered them all on web).
        for n, instance in enumerate(ctx.world.instances()):
            base = webhook_urls[n % 2]
            ctx.sim.register(instance, f"{base}/api/internal/webhook", token=f"TOKEN-{instance.name}".upper())
            ctx.sim.faults(instance.name, ack_delays_ms=ACKS_DELIVERED)
        Instance.objects.filter(pk__in=[i.pk for i in a_instances]).update(send_rate_per_second=s.r10_a_rate)
        Instance.objects.filter(pk=world.c.instance.pk).update(send_rate_per_second=s.r10_c_rate)
        consumers = {**queue_consumers(), **r10_copies.queue_consumers(
            ("maintenance", "sync", "bulk", "callbacks", "callbacks_relay"))}
        per_url: Counter[str] = Counter()

        # C alone, on the two-of-everything stack: the baseline of its wait. C's batches are accepted at once
        # with bench B6's bulk accept (on a loaded host the API would take longer to accept them than C's
        # pace to send them, and C would never wait for anything).
        alone_ids = c_batch(world.c, s.r10_c_messages, "r10-c-alone")
        alone = waits(alone_ids, s.drain_s)

        # A's blast (MARKETING over its whole fleet) is accepted while both relays are stopped, so that the
        # backlog waits in the outbox however fast a loaded host accepts (bench B6 builds it with the bulk
        # accept path); both relays start again and C sends at once, behind A's backlog.
        a_count = s.r10_messages - 2 * s.r10_c_messages
        relays = [ctx.stack.processes["relay"], copies["relay-2"]]
        stop_all(relays)
        a_out = send_alternating(ctx, urls, a_count, "r10-a", world.a, a_instances, "MARKETING", per_url)
        a_backlog = Message.objects.filter(project=world.a.project, sent_at__isnull=True).count()
        offsets = {relay.name: log_size(relay.log) for relay in relays}
        for relay in relays:
            relay.start()
        for relay in relays:  # C's wait must not include a relay's start-up
            wait_for_log(relay.log, "relay started", proc=relay.proc, start_at=offsets[relay.name], timeout=120)
        behind_ids = c_batch(world.c, s.r10_c_messages, "r10-c-behind")
        behind = waits(behind_ids, s.drain_s)
        a_sent_meanwhile = a_count - Message.objects.filter(project=world.a.project, sent_at__isnull=True).count()
        heartbeats_of_relays = relay_heartbeats()

        ids = [*alone_ids, *(x.id for x in a_out if x.id), *behind_ids]
        state = ctx.drain(ids, timeout=max(s.drain_s, a_count / max(1.0, s.r10_a_rate * len(a_instances)) * 2))
        texts = set(Message.objects.filter(pk__in=ids).values_list("text", flat=True))
        groups = ctx.sends_by_text()
        dup = duplicate_sends(groups, texts)
        never_sent = sum(1 for t in texts if t not in groups)
        channels = dict(IngestionEvent.objects.values_list("channel").annotate(n=Count("id")))
        # Every callback C's messages owe (their status lines, final now) reaches the receiver.
        wait_for(lambda: r10_copies.callbacks_owed(world.c) <= {int(r.payload["data"]["sequence"])
                                                                for r in receiver.accepted()}, s.drain_s, 1.0)
        callbacks = r10_copies.callback_figures(world.c, receiver)
        alive = {name: p.alive() for name, p in copies.items()}
        task_errors = lane_task_errors(log_offsets)
        ratio = behind["p99_s"] / alone["p99_s"] if alone["p99_s"] else math.nan
    finally:
        Instance.objects.filter(pk__in=[*(i.pk for i in a_instances), world.c.instance.pk]).update(send_rate_per_second=None)
        if not ctx.stack.processes["relay"].alive():  # the next rows need the stack's own relay
            ctx.stack.processes["relay"].start()
        stop_all(copies.values())
        receiver.stop()
    figures = {
        "sends": len(a_out) + len(alone_ids) + len(behind_ids),
        "a_http_answers": answers(a_out),  # C's batches are bulk-accepted
        "accepted_per_web_pool": {("web" if u == ctx.stack.web_url else "web-2"): n for u, n in per_url.items()},
        "processes": sorted([*ctx.stack.processes, *copies]),
        "queue_consumers": consumers,
        "relay_heartbeats": heartbeats_of_relays,
        "second_beat_exit_status": refused["exit_status"],
        "second_beat": refused,
        "copies_alive_at_end": all(alive.values()),
        "lost": state["lost"],
        "final": state["by_status"],
        "duplicate_sendtext_calls": dup["extra_calls"],
        "duplicate_accepted_sends": dup["extra_accepted_sends"],
        "accepted_but_never_sent": never_sent,
        "inbox_rows_by_channel": channels,
        "c_callbacks_owed": callbacks["owed"],
        "c_callbacks_lost": callbacks["lost"],
        "c_callbacks": callbacks,
        "lane_task_errors": task_errors,
        "a_backlog_when_c_sent": a_backlog,
        "a_sent_while_c_waited": a_sent_meanwhile,
        "c_alone": alone,
        "c_behind_a": behind,
        "fairness_ratio": round(ratio, 2) if not math.isnan(ratio) else None,
        "drain_s": state["drain_s"],
    }
    if not all(alive.values()):
        figures["copies_dead_at_end"] = sorted(name for name, up in alive.items() if not up)
    passed = (all(x.id for x in a_out) and state["lost"] == 0 and dup["extra_calls"] == 0
              and all(v >= 2 for v in consumers.values()) and all(alive.values())
              and refused["exit_status"] == refused["expected"] and refused["said"] is not None
              and callbacks["owed"] > 0 and callbacks["lost"] == 0 and callbacks["bad_signatures"] == 0
              and channels.get("WEBHOOK", 0) > 0 and channels.get("RABBITMQ", 0) > 0
              and behind["sent"] == behind["count"] and not math.isnan(ratio) and ratio <= TARGET_RATIO)
    notes = [f"both relays stopped while A's blast was accepted, started again right before C sent; A's "
             f"{len(a_instances)} instances paced at {s.r10_a_rate:g}/s each, C's one at {s.r10_c_rate:g}/s",
             "beat ran once with its default periods (maintenance, sync, callbacks relay); the second beat was started "
             "while it ran"]
    return {"passed": passed, "fault": FAULT.format(n=s.r10_messages), "must": MUST, "figures": figures,
            "notes": notes}
