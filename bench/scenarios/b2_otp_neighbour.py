"""B2 beside another tenant's OTP stream (issue 25 §3: a growing OTP stream must not halve every other tenant's
throughput).

Each B2 run is followed at once by the same pipeline with project B's OTPs arriving at `b2_otp_rate` per second
through the HTTP API; the ratio is taken inside that pair, seconds apart, so a phase of the shared host falls on
both sides of it.

On a CPU-bound machine the OTPs' own work takes its part of the cores whatever the product does. The pair's CPU
(our processes, the simulator and our own servers, not the load generator) says how large that part is:

- `otp_cpu_ms`: the run with OTPs' CPU less the run alone's (the same B2 messages on both sides), per OTP;
- `otp_cpu_share`: that CPU per second of the run with OTPs, over the machine's cores;
- `kept_of_left`: the ratio over (1 - otp_cpu_share), what B2 kept of the CPU the OTPs left it. Near 1, the
  OTPs cost the other tenant their own work and nothing more; well under 1, something of ours makes B2 wait.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..ablation_measure import own_server_roots
from ..context import Context
from ..procstats import CpuMeter
from ..stats import Spread, ratio
from .b3_otp_latency import OtpStream

FLOOR = 0.5  # "must not halve"


def own_meter(ctx: Context) -> CpuMeter:
    """Our processes (the simulator among them) and our own servers: not the load generator, not other clones'."""
    return CpuMeter({**ctx.roots(), **own_server_roots()})


def cpu_seconds(meter: CpuMeter) -> float:
    return sum(meter.by_kind.values())


def beside(ctx: Context, count: int, rate: float, alone: dict[str, Any], alone_cpu_s: float,
           pipeline: Any) -> dict[str, Any]:
    """The pipeline again, fresh, with the OTP stream alongside; `alone` is the run just before it."""
    ctx.fresh()
    stream = OtpStream(ctx, rate)
    with own_meter(ctx) as meter, stream:
        result = pipeline(ctx, count)
    otp = stream.latencies()
    otps = len(stream.ids)
    extra_s = cpu_seconds(meter) - alone_cpu_s
    share = extra_s / (meter.wall * (os.cpu_count() or 1)) if meter.wall else math.nan
    kept = ratio(result["sent_rate"], alone["sent_rate"])
    return {
        "sent_rate": result["sent_rate"], "read_rate": result["read_rate"],
        "all_sent": result["all_sent"], "all_read": result["all_read"], "sent_s": result["sent_s"],
        "alone_sent_rate": alone["sent_rate"], "ratio": kept,
        "otps": otps, "otps_all_sent": otp.get("all_sent", False), "otp_p99_ms": otp.get("p99_ms"),
        "stream_error": stream.error,
        "cpu_s": round(cpu_seconds(meter), 2), "alone_cpu_s": round(alone_cpu_s, 2), "wall_s": round(meter.wall, 2),
        "otp_cpu_ms": round(1000 * extra_s / otps, 1) if otps else math.nan,
        "otp_cpu_share": round(share, 3),
        "kept_of_left": ratio(kept, 1 - share) if share < 1 else math.nan,
    }


def summary(rate: float, runs: list[dict[str, Any]]) -> dict[str, Any]:
    kept = Spread.of([r["ratio"] for r in runs])
    whole = all(r["all_sent"] and r["otps_all_sent"] and not r["stream_error"] for r in runs)
    return {
        "otp_rate": rate,
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
