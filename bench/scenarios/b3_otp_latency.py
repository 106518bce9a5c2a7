"""B3: OTP accept → SENT latency while a marketing backlog drains, against the same stream idle.

The backlog is created with the bulk accept path (bench.backlog), spread over project A's fleet
(one instance alone would be paced to SEND_RATE_PER_INSTANCE and hardly load the machine); the OTP stream goes through the
real HTTP API at a steady rate, to numbers without opt-in (so through the official instance, as a
real OTP would). Latency = sent_at - created_at of each OTP, both stamped by the product.

The simulator runs at B8's priority for both streams (`gateway_cpu`): the real gateway has machines of its own,
and at the stack's share of the two cores the stand-in served an OTP's sendText late whenever the backlog's
receipts kept it busy (bench/findings.md, "Reading the numbers").

Callbacks are on for every message (issue 23: "callbacks must never slow an OTP"): each run registers a
`message.status` endpoint for project A (the backlog's and the OTP stream's) at a receiver in the bench
process, and publishes the callbacks relay pass as beat would (bench.callbacks_on); the callbacks worker
runs in the stack at its topology priority. Each run records how many callbacks the receiver got.
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import requests

from ..backlog import bulk_accept, live_key
from ..callbacks_on import Receiver, Tally, callbacks_on
from ..context import Context, cpu_summary, wait_for
from ..report_format import shares_text
from ..stats import Spread, percentile
from ..world import World


def otp_stream(ctx: Context, count: int, rate: float, answered_ms: dict[str, float] | None = None) -> list[str]:
    """The OTPs' ids in stream order; `answered_ms` gets each one's HTTP round trip (the accept, seen by the client)."""
    session = requests.Session()
    headers = {"Authorization": f"Bearer {ctx.world.a.live_key}"}
    ids: list[str] = []
    recipients = ctx.world.otp_recipients
    start = time.monotonic()
    for i in range(count):
        due = start + i / rate
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        response = session.post(
            f"{ctx.stack.web_url}/v1/messages/send",
            json={"to": recipients[i % len(recipients)], "category": "OTP", "text": "Your code is {{code}}",
                  "variables": {"code": f"{i:06d}"}},
            headers=headers, timeout=30,
        )
        response.raise_for_status()
        ids.append(response.json()["id"])
        if answered_ms is not None:
            answered_ms[ids[-1]] = response.elapsed.total_seconds() * 1000
    return ids


def latencies(ctx: Context, ids: list[str], answered_ms: dict[str, float] | None = None) -> dict[str, Any]:
    from messaging.models import Message

    met, _ = wait_for(lambda: Message.objects.filter(pk__in=ids, sent_at__isnull=False).count() >= len(ids),
                      ctx.sizes.wait_timeout, 0.25)
    rows = {mid: (created, dispatched, sent) for mid, created, dispatched, sent in Message.objects.filter(pk__in=ids)
            .values_list("id", "created_at", "dispatched_at", "sent_at")}
    times = [rows[uuid.UUID(i)] for i in ids]  # in stream order
    values = [(sent - created).total_seconds() * 1000 if sent else float("inf") for created, _, sent in times]
    slowest = sorted(range(len(values)), key=lambda n: -values[n])[:3]
    parts = split(rows)
    return {"count": len(values), "all_sent": met, "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
            "max_ms": max(values, default=float("nan")), "segments": segments(parts),
            "values_ms": [round(v, 1) for v in values],  # in stream order: the pooled p99 of all runs is taken on these
            # (position in the stream, ms, its relay/pickup/http ms, the accept's HTTP round trip): whether the tail
            # is the cold start or spread out, and where it waited
            "slowest": [(n, round(values[n]), [round(v) for v in parts.get(uuid.UUID(ids[n]), ())],
                         round(answered_ms[ids[n]]) if answered_ms and ids[n] in answered_ms else None)
                        for n in slowest]}


class OtpStream:
    """Project B's OTPs at `rate` in a thread while the block runs: b3's otp_stream, one second's worth at a
    time, each second waited out, so the stream keeps its rate however long the pipeline takes."""

    def __init__(self, ctx: Any, rate: float):
        # Another tenant's OTPs: b3's helper sends as world.a, so give it a world whose `a` is project B.
        world: World = replace(ctx.world, a=ctx.world.b)
        self.ctx = replace(ctx, world=world)
        self.rate = rate
        self.ids: list[str] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        per_second = max(1, round(self.rate))
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                self.ids += otp_stream(self.ctx, per_second, self.rate)
                self._stop.wait(max(0.0, started + per_second / self.rate - time.monotonic()))
        except Exception as exc:  # reported with the figure: a stream that broke is no stream
            self.error = f"{exc.__class__.__name__}: {exc}"

    def __enter__(self) -> OtpStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def latencies(self) -> dict[str, Any]:
        return latencies(self.ctx, self.ids) if self.ids else {}


def split(rows: dict[Any, tuple[Any, Any, Any]]) -> dict[Any, tuple[float, float, float]]:
    """Where each OTP's time goes: accept → released by the relay (`relay`) → picked up, claimed and routed by a
    lane worker (`pickup`) → Evolution's answer (`http`, the call's own time, carried by the ATTEMPT line,
    which is stamped when the answer is back, just before sent_at). `rows`: id → (created, dispatched, sent)."""
    from messaging.models import EventKind, MessageEvent

    attempts = {
        message_id: (created, detail)
        for message_id, created, detail in MessageEvent.objects.filter(message_id__in=list(rows), kind=EventKind.ATTEMPT)
        .values_list("message_id", "created_at", "detail")
    }
    parts: dict[Any, tuple[float, float, float]] = {}
    for message_id, (created, dispatched, _) in rows.items():
        if message_id not in attempts or dispatched is None:
            continue
        answered, detail = attempts[message_id]
        http = float(detail.get("elapsedMs") or 0)
        parts[message_id] = ((dispatched - created).total_seconds() * 1000,
                             (answered - dispatched).total_seconds() * 1000 - http, http)
    return parts


def segments(parts: dict[Any, tuple[float, float, float]]) -> dict[str, dict[str, float]]:
    """p50 and p99 of each segment of `split`."""
    columns = list(zip(*parts.values())) or [(), (), ()]
    return {name: {"p50_ms": percentile(list(values), 50), "p99_ms": percentile(list(values), 99)}
            for name, values in zip(("relay", "pickup", "http"), columns)}


def _segments_text(result: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v['p50_ms']:.0f}/{v['p99_ms']:.0f}" for k, v in result["segments"].items())


def one_run(ctx: Context, backlog: int, receiver: Receiver | None = None) -> dict[str, Any]:
    """One stream; with callbacks on when given a receiver and b3_callbacks is set (the ablation passes none)."""
    from messaging.models import Message

    ctx.fresh()  # empties the callbacks tables too: the endpoint is this run's own
    on = receiver is not None and bool(ctx.sizes.b3_callbacks)
    with callbacks_on(ctx.world.a.project, receiver) if on and receiver is not None else nullcontext():
        if backlog:
            bulk_accept(ctx.world.a.project, live_key(ctx.world.a.project), ctx.world.a.recipients, backlog, "MARKETING",
                        instances=[i.name for i in ctx.world.fleet])
        # Not measured: the first OTPs after emptying the tables meet cold caches (API key, instance
        # state, prepared statements, each prefork child's first task) and were the idle run's tail.
        # One stream at one steady rate: as two streams, the measured one's first OTP followed the last
        # warm-up OTP at once instead of 1/rate later, waited behind it, and was the slowest of many runs.
        warmup = ctx.sizes.b3_warmup_otps
        answered_ms: dict[str, float] = {}
        # The whole machine's CPU while the stream ran, servers included: whether the OTPs met a host with cores
        # to spare or a saturated one (what sets the busy stream's tail, bench/findings.md).
        with ctx.cpu(servers=True) as meter:
            ids = otp_stream(ctx, warmup + ctx.sizes.b3_otps, ctx.sizes.b3_otp_rate, answered_ms)[warmup:]
        result = latencies(ctx, ids, answered_ms)
        result["stream_cpu"] = cpu_summary(meter)
        if backlog:
            # Proof that the backlog was really draining meanwhile (and not done before the stream ended).
            sent = Message.objects.filter(category="MARKETING", sent_at__isnull=False).count()
            result["backlog_sent_during_run"] = sent
            result["backlog_left"] = backlog - sent
        if on and receiver is not None:
            result["callbacks"] = callbacks_figures(ctx, receiver, ids)
    return result


# After the measured window (not measured): how long the receiver may take to catch up with the status
# changes made by its end (the relay pass ticks every CALLBACKS_RELAY_SECONDS; a busy run's backlog goes on).
CALLBACKS_SETTLE_SECONDS = 15.0


def callbacks_figures(ctx: Context, receiver: Receiver, ids: list[str]) -> dict[str, Any]:
    """What the receiver got by the end of the measured window (`delivered_in_window`) against the status
    changes made by then (each one `message.status` callback: the timeline's STATUS, FAILED and RESENT lines
    of project A's messages), then once it has caught up with those or CALLBACKS_SETTLE_SECONDS passed
    (`delivered`)."""
    from callbacks.derive_events import STATUS_KINDS
    from django.db.models import Max

    from callbacks.models import Delivery, RelayCursor
    from messaging.models import MessageEvent

    in_window = receiver.snapshot().received
    owed = MessageEvent.objects.filter(kind__in=STATUS_KINDS, message__project=ctx.world.a.project).count()
    settled, _ = wait_for(lambda: receiver.snapshot().received >= owed, CALLBACKS_SETTLE_SECONDS, 0.2)
    tally: Tally = receiver.snapshot()
    later = MessageEvent.objects.filter(kind__in=STATUS_KINDS, message__project=ctx.world.a.project).count()
    # How far the relay pass has read the timeline by then: it reads every line (the backlog's ACCEPTED
    # ones too) to find the status changes, so this says whether the deliveries or their derivation lag.
    cursor = RelayCursor.objects.filter(name="timeline").values_list("position", flat=True).first() or 0
    last_line = MessageEvent.objects.aggregate(last=Max("id"))["last"] or 0
    return {"delivered_in_window": in_window, "status_changes": owed, "delivered": tally.received,
            "status_changes_then": later, "caught_up": settled, "timeline_read": cursor, "timeline_lines": last_line, "deliveries_written": Delivery.objects.count(),
            "signatures_checked": tally.verified + tally.bad_signatures, "bad_signatures": tally.bad_signatures,
            "otps_with_callback": sum(1 for i in ids if tally.by_message.get(i))}


def _machine_text(result: dict[str, Any]) -> str:
    cpu = result.get("stream_cpu") or {}
    busy = cpu.get("machine_busy_share")
    if busy is None:
        return "machine busy ?"
    return f"machine busy {busy:.0%} ({shares_text(cpu.get('share', {}), top=4)})"


def _callbacks_text(result: dict[str, Any]) -> str:
    c = result.get("callbacks")
    if not c:
        return "callbacks off"
    return (f"callbacks on: {c['delivered_in_window']} delivered in the window (of {c['status_changes']} status "
            f"changes), {c['delivered']} of {c['status_changes_then']} after it, timeline read to line "
            f"{c['timeline_read']} of {c['timeline_lines']}")


def run(ctx: Context) -> dict[str, Any]:
    from .b8_slow_gateway import GATEWAY_NICE, gateway_cpu  # b8 imports this module's stream

    sizes = ctx.sizes
    idle: list[dict[str, Any]] = []
    busy: list[dict[str, Any]] = []
    receiver = Receiver()
    try:
        with gateway_cpu(ctx) as raised, ctx.cpu() as meter:
            for n in range(sizes.runs):
                idle.append(one_run(ctx, 0, receiver))
                busy.append(one_run(ctx, sizes.b3_backlog, receiver))
                ctx.log(f"  B3 run {n + 1}: idle p50/p99 {idle[-1]['p50_ms']:.0f}/{idle[-1]['p99_ms']:.0f} ms "
                        f"(segments p50/p99 {_segments_text(idle[-1])}; {_machine_text(idle[-1])}; "
                        f"{_callbacks_text(idle[-1])}), "
                        f"with backlog {busy[-1]['p50_ms']:.0f}/{busy[-1]['p99_ms']:.0f} ms "
                        f"({busy[-1].get('backlog_left', 0)} of the backlog left; segments p50/p99 {_segments_text(busy[-1])}; "
                        f"{_machine_text(busy[-1])}; "
                        f"{_callbacks_text(busy[-1])}); slowest idle {idle[-1]['slowest']}, busy {busy[-1]['slowest']}")
    finally:
        receiver.stop()
    ctx.fresh()
    idle_p99 = Spread.of([r["p99_ms"] for r in idle])
    busy_p99 = Spread.of([r["p99_ms"] for r in busy])
    # The figure: the p99 of every run's OTPs together, hundreds of samples, where one run's p99 is its second or
    # third slowest OTP. This host's disk alone stalls an fsync for 0.2-0.4 s about once a thousand times, idle
    # (an OTP commits four times), so one run's p99 is whichever run met a stall; the median of the runs' p99s
    # (`ratio_of_run_p99s`) is kept beside it.
    pooled = {phase: percentile([v for r in runs for v in r["values_ms"]], 99) for phase, runs in (("idle", idle), ("busy", busy))}
    ratio = pooled["busy"] / pooled["idle"] if pooled["idle"] else float("nan")
    ratio_of_run_p99s = busy_p99.median / idle_p99.median if idle_p99.median else float("nan")
    return {
        "backlog": sizes.b3_backlog, "otps": sizes.b3_otps, "otp_rate": sizes.b3_otp_rate,
        "warmup_otps": sizes.b3_warmup_otps,
        "idle": {"p50_ms": Spread.of([r["p50_ms"] for r in idle]).as_dict(), "p99_ms": idle_p99.as_dict(), "runs": idle},
        "backlog_run": {"p50_ms": Spread.of([r["p50_ms"] for r in busy]).as_dict(), "p99_ms": busy_p99.as_dict(),
                        "runs": busy},
        "ratio": ratio,
        "pooled_p99_ms": pooled,
        "ratio_of_run_p99s": ratio_of_run_p99s,
        "callbacks": bool(sizes.b3_callbacks),
        "gateway_nice": GATEWAY_NICE if raised else 0,
        "callbacks_delivered": {"idle": [r.get("callbacks", {}).get("delivered", 0) for r in idle],
                                "backlog_run": [r.get("callbacks", {}).get("delivered", 0) for r in busy]},
        "target": {"ratio": 1.5, "p99_ms": 250},
        "met": ratio <= 1.5 and pooled["busy"] <= 250 and all(r["all_sent"] for r in busy + idle),
        "cpu": cpu_summary(meter),
    }
