"""B2 beside another tenant's OTP stream (issue 25 §3: a growing OTP stream must not halve every other tenant's
throughput).

Each B2 run is followed at once by the same pipeline with project B's OTPs arriving at `b2_otp_rate` per second
through the HTTP API; the ratio is taken inside that pair, seconds apart, so a phase of the shared host falls on
both sides of it.

On a CPU-bound machine the OTPs' own work takes its part of the cores whatever the product does. Between the two
runs of a pair the OTP stream runs alone for `b2_otp_alone_seconds` (bench/sizes.py), and the CPU it adds to the
idle stack (our processes, the simulator and our own servers, not the load generator) says how large that part is:

- `otp_cpu_ms`: that CPU per OTP (per second of the stream, over its rate);
- `otp_cpu_share`: `otp_cpu_ms` × the stream's rate, over the machine's cores;
- `kept_of_left`: the ratio over (1 - otp_cpu_share), what B2 kept of the CPU the OTPs left it. Near 1, the
  OTPs cost the other tenant their own work and nothing more; well under 1, something of ours makes B2 wait.
  CPU per unit of work moves with the host's phases too (bench/findings.md), so this is an estimate.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from ..ablation_measure import cpu_seconds, own_meter
from ..context import Context, wait_for
from ..stats import Spread, ratio
from .b3_otp_latency import OtpStream

FLOOR = 0.5  # "must not halve"


def otp_stream_alone(ctx: Context, rate: float, seconds: float) -> dict[str, Any]:
    """The CPU the OTP stream adds to an idle stack: our CPU per second while the stream runs alone for `seconds`,
    less our CPU per second over as long with nothing to do just before. Taken during the stream, in its steady
    state (receipts of earlier OTPs arrive while later ones are sent), not in the quiet tail after it, where the
    stack's own idle work would be charged to the OTPs."""
    from messaging.models import Message

    ctx.fresh()
    with own_meter(ctx) as idle:
        time.sleep(seconds / 3)
    stream = OtpStream(ctx, rate)
    with stream, own_meter(ctx) as busy:
        time.sleep(seconds)
    ids = list(stream.ids)
    all_read, _ = wait_for(lambda: Message.objects.filter(pk__in=ids, status="READ").count() >= len(ids),
                           ctx.sizes.wait_timeout, 0.25)
    idle_rate = cpu_seconds(idle) / idle.wall
    added_rate = max(0.0, cpu_seconds(busy) / busy.wall - idle_rate)
    by_kind = {kind: round(1000 * (busy.by_kind.get(kind, 0.0) / busy.wall - idle.by_kind.get(kind, 0.0) / idle.wall)
                           / rate, 1)
               for kind in sorted(set(busy.by_kind) | set(idle.by_kind))} if ids else {}
    return {"otps": len(ids), "all_read": all_read and bool(ids), "stream_error": stream.error,
            "idle_cpu_share": round(idle_rate / (os.cpu_count() or 1), 3),
            "cpu_ms": round(1000 * added_rate / rate, 1) if ids else math.nan,
            # Where each OTP's CPU went, per process kind (a kind can read below zero by noise).
            "cpu_ms_by_kind": by_kind}


def beside(ctx: Context, count: int, rate: float, alone: dict[str, Any], pipeline: Any) -> dict[str, Any]:
    """The OTP stream alone (its CPU per OTP), then the pipeline again, fresh, with the stream alongside; `alone`
    is the pipeline's run just before."""
    cost = otp_stream_alone(ctx, rate, ctx.sizes.b2_otp_alone_seconds)
    ctx.fresh()
    stream = OtpStream(ctx, rate)
    with stream:
        result = pipeline(ctx, count)
    otp = stream.latencies()
    share = cost["cpu_ms"] * rate / 1000 / (os.cpu_count() or 1)
    kept = ratio(result["sent_rate"], alone["sent_rate"])
    return {
        "sent_rate": result["sent_rate"], "read_rate": result["read_rate"],
        "all_sent": result["all_sent"], "all_read": result["all_read"], "sent_s": result["sent_s"],
        "alone_sent_rate": alone["sent_rate"], "ratio": kept,
        "otps": len(stream.ids), "otps_all_sent": otp.get("all_sent", False), "otp_p99_ms": otp.get("p99_ms"),
        "stream_error": stream.error or cost["stream_error"],
        "otp_alone": cost,
        "otp_cpu_ms": cost["cpu_ms"],
        "otp_cpu_share": round(share, 3),
        "kept_of_left": ratio(kept, 1 - share) if share < 1 else math.nan,
    }


def summary(rate: float, runs: list[dict[str, Any]], alone_seconds: float | None = None) -> dict[str, Any]:
    kept = Spread.of([r["ratio"] for r in runs])
    whole = all(r["all_sent"] and r["otps_all_sent"] and not r["stream_error"]
                and r.get("otp_alone", {}).get("all_read", True) for r in runs)
    return {
        "otp_rate": rate, "otp_alone_seconds": alone_seconds,
        "sent_rate": Spread.of([r["sent_rate"] for r in runs]).as_dict(),
        "ratio": kept.as_dict(),
        "otp_cpu_ms": Spread.of([r["otp_cpu_ms"] for r in runs]).as_dict(),
        "otp_cpu_share": Spread.of([r["otp_cpu_share"] for r in runs]).as_dict(),
        "kept_of_left": Spread.of([r["kept_of_left"] for r in runs]).as_dict(),
        "otp_p99_ms": Spread.of([r["otp_p99_ms"] if r["otp_p99_ms"] is not None else math.nan for r in runs]).as_dict(),
        "target": {"ratio": FLOOR},
        "met": whole and kept.median >= FLOOR,
        "runs": runs,
    }
