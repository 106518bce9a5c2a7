"""R9: the customer's callback receiver is down (its port closed: connection refused) for
`r9_down_seconds` while `r9_messages` sends go through, then comes back (issue 23).

Project A registers a `message.status` endpoint through the API at a real HTTP receiver in the harness
process (tests/support/receiver.py: it checks every Standard Webhooks signature and keeps every request).
The chaos stack has no beat and no callbacks workers: this row starts the Procfile's `worker_callbacks` and
`worker_callbacks_relay` for its own run (stopped when it ends) and publishes the `callbacks.relay` pass to the
`callbacks_relay` queue every CALLBACKS_RELAY_SECONDS, as beat's entry does (bench.callbacks_on.RelayTicker).

1. Receiver up: an idle OTP stream (bench B3's method: OTPs through the HTTP API at a steady rate to
   numbers without opt-in, so through the official instance; latency = sent_at - created_at).
2. Receiver down: the sends (UTILITY and MARKETING over A's fleet, every 50th to a number WhatsApp does
   not know, which fails and is then resent with a corrected `to` through the API, so FAILED and RESENT
   lines are owed too), with the same OTP stream measured meanwhile.
3. Receiver up again: every message drains to a final status, then the row waits until every status
   change of A's messages (the timeline's STATUS, FAILED and RESENT lines) has reached the receiver.

Retries: the product's schedule is Svix's (0, 5 s, 5 min, 30 min, 2 h, …), so a delivery that failed
twice in the outage would come back 5 to 30 minutes after it. The row's callbacks worker runs with a
shorter schedule through the documented setting CALLBACKS_RETRY_SCHEDULE (20 steps, the most it takes:
0, 5 s, then equal steps that together outlast twice the outage, so no delivery runs out of tries) and
CALLBACKS_CIRCUIT_OPEN_SECONDS at that step (60 s at most, the default); everything else is the default.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import requests

from ..context import ACKS_READ, Context, Sent, wait_for
from ..world import phone
from .common import answers

FAULT = "callback receiver down {down:g}s (connection refused) during {n} sends, then up"
MUST = ("0 callbacks lost; each message's last callback (by sequence) is its final status; no bad signature; "
        "OTP p99 during the outage ≤ 1.5× idle and ≤ 250 ms (B3)")
TARGET_RATIO = 1.5
TARGET_P99_MS = 250.0
RETRY_STEPS = 20  # settings.envwaits: at most 20 waits
FAILING_EVERY = 50  # every n-th send goes to a number WhatsApp does not know, then is resent corrected
NOT_ON_WHATSAPP = phone(190_000)
OTP_RECIPIENTS = [phone(200_000 + i) for i in range(50)]  # no opt-in: an OTP to them goes through the official number


def worker_settings(down_s: float) -> dict[str, str]:
    """The callbacks worker's environment for this row: a schedule that outlasts twice the outage."""
    step = max(2, math.ceil((2 * down_s + 60) / (RETRY_STEPS - 2)))
    schedule = [0, min(5, step)] + [step] * (RETRY_STEPS - 2)
    return {
        "CALLBACKS_RETRY_SCHEDULE": ",".join(str(w) for w in schedule),
        "CALLBACKS_CIRCUIT_OPEN_SECONDS": str(min(60, step)),
    }


CALLBACKS_WORKERS = ("worker_callbacks", "worker_callbacks_relay")


def start_callbacks_worker(ctx: Context, env: dict[str, str], name: str = "worker_callbacks") -> Any:
    """The Procfile's worker_callbacks (or `name`) next to the chaos stack (tests.support.processes.Process), at
    its Procfile priority (scripts/launch.sh, BACKGROUND_NICE), as bench B3 runs it: the chaos stack starts
    its own processes without one, but whether callbacks slow an OTP depends on it."""
    from pilot_status import topology
    from tests.support.processes import ROOT, Process, log_size, wait_for_log

    described = topology.process(name)
    argv = topology.launched(described, described.command(ctx.stack.site()), str(ROOT / topology.LAUNCHER))
    process = Process(described.service, argv, {**ctx.stack.env, **env})
    offset = log_size(process.log)
    process.start()
    wait_for_log(process.log, "ready.", proc=process.proc, start_at=offset, timeout=60)
    return process


def create_endpoint(ctx: Context, url: str) -> dict[str, Any]:
    """Through the API, as a customer does: the answer carries the signing secret."""
    r = requests.post(f"{ctx.stack.web_url}/v1/webhook-endpoints", json={"url": url, "eventTypes": ["message.status"]},
                      headers={"Authorization": f"Bearer {ctx.world.a.live_key}"}, timeout=15)
    if r.status_code != 201:
        raise RuntimeError(f"endpoint refused: {r.status_code} {r.text[:300]}")
    return dict(r.json())


def b3_view(ctx: Context) -> Any:
    """What bench B3's otp_stream/latencies read from their context, from chaos' own."""
    world = SimpleNamespace(a=ctx.world.a, otp_recipients=OTP_RECIPIENTS)
    return SimpleNamespace(stack=ctx.stack, world=world, sizes=SimpleNamespace(wait_timeout=ctx.sizes.drain_s))


def otp_figures(ctx: Context, ids: list[str], answered_ms: dict[str, float]) -> dict[str, Any]:
    from bench.scenarios.b3_otp_latency import latencies

    result = latencies(b3_view(ctx), ids, answered_ms)
    result.pop("values_ms", None)
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in result.items()}


def paced_sends(ctx: Context, n: int, seconds: float, out: list[Sent]) -> None:
    """n sends spread evenly over `seconds` by `sizes.senders` threads: UTILITY and MARKETING in turn over
    A's fleet, every FAILING_EVERY-th to NOT_ON_WHATSAPP."""
    a = ctx.world.a
    rate = n / max(seconds, 0.1)

    def one(i: int) -> Sent:
        to = NOT_ON_WHATSAPP if i % FAILING_EVERY == FAILING_EVERY // 5 else a.recipients[i % len(a.recipients)]
        return ctx.send(to, f"r9 #{i}", ("UTILITY", "MARKETING")[i % 2], instance=a.fleet[i % len(a.fleet)].name)

    start = time.monotonic()
    with ThreadPoolExecutor(ctx.sizes.senders) as ex:
        futures = []
        for i in range(n):
            if (wait := start + i / rate - time.monotonic()) > 0:
                time.sleep(wait)
            futures.append(ex.submit(one, i))
        out.extend(f.result() for f in futures)


def resend_corrected(ctx: Context, ids: list[str], timeout: float) -> dict[str, Any]:
    """The messages to NOT_ON_WHATSAPP, once dead-lettered, resent through the API with a corrected `to`."""
    from messaging.models import DeadLetter

    def dead() -> list[int]:
        return list(DeadLetter.objects.filter(message_id__in=ids, resolved_at__isnull=True).values_list("pk", flat=True))

    wait_for(lambda: len(dead()) >= len(ids), timeout, 0.5)
    codes: Counter[int] = Counter()
    for pk in dead():
        r = requests.post(f"{ctx.stack.web_url}/v1/dead-letters/{pk}/resend", json={"to": ctx.world.a.recipients[0]},
                          headers={"Authorization": f"Bearer {ctx.world.a.live_key}"}, timeout=15)
        codes[r.status_code] += 1
    return {"to_resend": len(ids), "answers": dict(codes)}


def callback_figures(ctx: Context, receiver: Any, message_ids: list[str]) -> dict[str, Any]:
    """Owed: every STATUS/FAILED/RESENT line of A's messages (a `message.status` callback each). Received:
    the receiver's requests answered 2xx (signature held), by `data.sequence` (the line's id)."""
    from callbacks.derive_events import STATUS_KINDS
    from messaging.models import Message, MessageEvent

    owed = dict(MessageEvent.objects.filter(kind__in=STATUS_KINDS, message__project=ctx.world.a.project)
                .values_list("pk", "message_id"))
    everything = list(receiver.received)
    accepted = [r for r in everything if r.answered == 204]
    by_sequence: dict[int, Any] = {}
    webhook_ids: Counter[str] = Counter()
    for r in accepted:
        data = r.payload["data"]
        by_sequence.setdefault(int(data["sequence"]), data)
        webhook_ids[r.headers.get("webhook-id", "")] += 1
    lost = sorted(set(owed) - set(by_sequence))
    # Each message's callback with the highest sequence, and the last to arrive, against its final status.
    final = {str(pk): status for pk, status in Message.objects.filter(pk__in=message_ids).values_list("pk", "status")}
    highest: dict[str, dict[str, Any]] = {}
    last_arrived: dict[str, str] = {}
    for r in accepted:
        data = r.payload["data"]
        mid = str(data["messageId"])
        if mid not in highest or int(data["sequence"]) > int(highest[mid]["sequence"]):
            highest[mid] = data
        last_arrived[mid] = data["status"]
    not_final = [mid for mid in message_ids if highest.get(mid, {}).get("status") != final.get(mid)]
    return {
        "owed": len(owed),
        "received": len(everything),
        "received_2xx": len(accepted),
        "distinct_webhook_ids": len(webhook_ids),
        "delivered_more_than_once": sum(1 for n in webhook_ids.values() if n > 1),
        "bad_signatures": sum(1 for r in everything if not r.verified),
        "lost": len(lost),
        "lost_sequences": lost[:10],
        "messages": len(message_ids),
        "last_by_sequence_not_final": len(not_final),
        "not_final_examples": [(mid, highest.get(mid, {}).get("status"), final.get(mid)) for mid in not_final[:5]],
        # Informational: where arrival order and sequence disagree (why a receiver keeps the highest sequence).
        "last_arrived_not_final": sum(1 for mid in message_ids if last_arrived.get(mid) != final.get(mid)),
    }


def delivery_figures(endpoint_id: str, down_at: Any, up_at: Any) -> dict[str, Any]:
    from django.db.models import Count, Max

    from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint

    endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
    attempts = DeliveryAttempt.objects.filter(delivery__endpoint_id=endpoint_id)
    return {
        "deliveries_by_status": dict(Delivery.objects.filter(endpoint_id=endpoint_id).values_list("status")
                                     .annotate(n=Count("id"))),
        "attempts": attempts.count(),
        "attempts_refused_during_outage": attempts.filter(attempted_at__gte=down_at, attempted_at__lte=up_at,
                                                          succeeded=False).count(),
        "most_attempts_for_one_delivery": Delivery.objects.filter(endpoint_id=endpoint_id)
        .aggregate(m=Max("attempts"))["m"] or 0,
        # receiver up → the last callback delivered (the deliveries' own stamps)
        "last_delivered_after_up_s": round((last - up_at).total_seconds(), 1) if (last := Delivery.objects.filter(
            endpoint_id=endpoint_id).aggregate(m=Max("delivered_at"))["m"]) else None,
        "endpoint_enabled_at_end": endpoint.enabled,
        "circuit_at_end": endpoint.circuit_state,
    }


def run(ctx: Context) -> dict[str, Any]:
    from django.utils import timezone

    from bench.callbacks_on import RelayTicker
    from bench.scenarios.b3_otp_latency import otp_stream
    from callbacks import endpoints
    from callbacks.models import WebhookEndpoint
    from django.conf import settings
    from messaging import opt_ins
    from messaging.models import Message
    from tests.support.receiver import Receiver

    s = ctx.sizes
    down_s = s.r9_down_seconds
    ctx.fresh(ACKS_READ)  # empties the callbacks tables too (chaos.world.SCENARIO_TABLES)
    if not ctx.world.a.project.opt_ins.filter(phone=NOT_ON_WHATSAPP, revoked_at__isnull=True).exists():
        opt_ins.record(ctx.world.a.project, NOT_ON_WHATSAPP, "chaos")
    for instance in ctx.world.a.fleet:
        ctx.sim.faults(instance.name, ack_delays_ms=ACKS_READ, not_on_whatsapp=[NOT_ON_WHATSAPP])
    env = worker_settings(down_s)
    secret: dict[str, str] = {}
    receiver = Receiver(lambda: secret.get("value", ""))
    receiver.set("ok")
    workers: list[Any] = []
    ticker = None
    endpoint_id = ""
    sent: list[Sent] = []
    notes = [f"the callbacks worker ran with CALLBACKS_RETRY_SCHEDULE={env['CALLBACKS_RETRY_SCHEDULE']} and "
             f"CALLBACKS_CIRCUIT_OPEN_SECONDS={env['CALLBACKS_CIRCUIT_OPEN_SECONDS']} (documented settings; the "
             "product's default is Svix's 0,5,300,1800,… schedule, whose later steps would make the wait after the "
             "outage 5-30 min); nothing was replayed: the retries alone delivered what is counted"]
    try:
        for name in CALLBACKS_WORKERS:  # appended one by one: a failed start still stops the first
            workers.append(start_callbacks_worker(ctx, env, name))
        created = create_endpoint(ctx, receiver.url)
        secret["value"], endpoint_id = created["secret"], created["id"]
        ticker = RelayTicker(float(settings.CALLBACKS_RELAY_SECONDS)).start()

        # 1. Idle: the OTP stream with callbacks flowing (the first OTPs after emptying the tables are not measured).
        idle_answered: dict[str, float] = {}
        stream = b3_view(ctx)
        idle_ids = otp_stream(stream, s.r9_warmup_otps + s.r9_idle_otps, s.r9_otp_rate, idle_answered)
        idle = otp_figures(ctx, idle_ids[s.r9_warmup_otps:], idle_answered)

        # 2. Down: the sends (and the corrected resends) in a thread, the OTP stream measured meanwhile.
        with ctx.maintenance():
            receiver.set("down")
            down_at, down_mono = timezone.now(), time.monotonic()
            resent: dict[str, Any] = {}

            def sends() -> None:
                paced_sends(ctx, s.r9_messages, down_s * 0.6, sent)
                failing = [x.id for x in sent if x.id and x.to == NOT_ON_WHATSAPP]
                resent.update(resend_corrected(ctx, failing, max(5.0, down_s * 0.3)))

            sender = threading.Thread(target=sends, name="r9-sends", daemon=True)
            sender.start()
            outage_answered: dict[str, float] = {}
            otps = max(5, int(s.r9_otp_rate * down_s * 0.95))
            outage_ids = otp_stream(stream, otps, s.r9_otp_rate, outage_answered)
            sender.join(max(60.0, down_s))
            if (left := down_mono + down_s - time.monotonic()) > 0:
                time.sleep(left)
            outage_took = time.monotonic() - down_mono
            # 3. Up again.
            receiver.set("ok")
            up_at, up_mono = timezone.now(), time.monotonic()
        # Reported, not judged: the same stream while the deliveries held back by the outage go out at once.
        catch_up_answered: dict[str, float] = {}
        catch_up_ids: list[str] = []
        catch_up_stream = threading.Thread(
            target=lambda: catch_up_ids.extend(otp_stream(stream, max(5, int(s.r9_otp_rate * min(60.0, down_s))),
                                                          s.r9_otp_rate, catch_up_answered)),
            name="r9-catch-up-otps", daemon=True)
        catch_up_stream.start()
        outage = otp_figures(ctx, outage_ids, outage_answered)
        ids = [x.id for x in sent if x.id]
        state = ctx.drain([*ids, *idle_ids, *outage_ids])
        catch_up_stream.join(120.0)
        catch_up = otp_figures(ctx, catch_up_ids, catch_up_answered)
        catch_up["lost"] = ctx.drain(catch_up_ids)["lost"]  # final before their callbacks are judged
        from callbacks.derive_events import STATUS_KINDS
        from messaging.models import MessageEvent

        def caught_up() -> bool:
            owed = set(MessageEvent.objects.filter(kind__in=STATUS_KINDS, message__project=ctx.world.a.project)
                       .values_list("pk", flat=True))
            got = {int(r.payload["data"]["sequence"]) for r in receiver.accepted()}
            return owed <= got

        step = float(env["CALLBACKS_RETRY_SCHEDULE"].split(",")[-1])
        settled, _ = wait_for(caught_up, s.drain_s + 2 * step, 1.0)
        waited_s = round(time.monotonic() - up_mono, 1)
        ticker.stop()
        ticker = None
        time.sleep(1.0)  # a delivery in flight lands before the receiver is read
        cb = callback_figures(ctx, receiver, [str(m) for m in Message.objects.filter(project=ctx.world.a.project)
                                              .values_list("pk", flat=True)])
        deliveries = delivery_figures(endpoint_id, down_at, up_at)
    finally:
        if ticker is not None:
            ticker.stop()
        if endpoint_id:
            endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id).first()
            if endpoint is not None:
                endpoints.update(endpoint, {"enabled": False})  # nothing more for the rows after this one
        receiver.stop()
        for worker in workers:
            worker.stop()
    ratio = outage["p99_ms"] / idle["p99_ms"] if idle["p99_ms"] else math.nan
    figures = {
        "sends": len(sent),
        "answers": answers(sent),
        "corrected_resends": resent,
        "lost": state["lost"],
        "final": state["by_status"],
        "down_s": round(outage_took, 1),
        "callbacks_owed": cb["owed"],
        "callbacks_lost": cb["lost"],
        "last_callback_not_final": cb["last_by_sequence_not_final"],
        "bad_signatures": cb["bad_signatures"],
        "callbacks": cb,
        "deliveries": deliveries,
        "caught_up": settled,
        "catch_up_s": deliveries["last_delivered_after_up_s"],
        "waited_after_up_s": waited_s,
        "otp_p99_ms": {"idle": idle["p99_ms"], "outage": outage["p99_ms"]},
        "otp_ratio": round(ratio, 2) if not math.isnan(ratio) else None,
        "otp_idle": idle,
        "otp_outage": outage,
        "otp_catch_up_not_judged": catch_up,
        "drain_s": state["drain_s"],
    }
    passed = (bool(ids) and len(ids) == len(sent) and state["lost"] == 0 and catch_up["lost"] == 0 and settled and cb["lost"] == 0
              and cb["last_by_sequence_not_final"] == 0 and cb["bad_signatures"] == 0 and cb["owed"] > 0
              and deliveries["attempts_refused_during_outage"] > 0 and deliveries["endpoint_enabled_at_end"]
              and idle["all_sent"] and outage["all_sent"]
              and not math.isnan(ratio) and ratio <= TARGET_RATIO and outage["p99_ms"] <= TARGET_P99_MS)
    notes.append(f"OTP p99 (bench B3's method, {s.r9_otp_rate:g}/s): idle {idle['p99_ms']:.0f} ms over "
                 f"{idle['count']} OTPs, during the outage {outage['p99_ms']:.0f} ms over {outage['count']} "
                 f"(target ≤ {TARGET_RATIO}× idle and ≤ {TARGET_P99_MS:.0f} ms); judged on this run's figures on a "
                 f"shared, noisy 2-core host; right after the receiver came back (the held deliveries going out; "
                 f"reported, not judged) {catch_up['p99_ms']:.0f} ms over {catch_up['count']}")
    if outage_took > down_s + 5:
        notes.append(f"the OTP stream ran past the planned outage: the receiver was down {outage_took:.0f} s")
    return {"passed": passed, "fault": FAULT.format(down=down_s, n=s.r9_messages), "must": MUST,
            "figures": figures, "notes": notes}
