"""The profiled passes (not counted in any figure: sampling slows what it samples).

P1: the web workers while wrk drives POST /v1/messages/send (B1's funnel).
P2: relay, lane workers, consumer and the webhook pool while a B2-sized pipeline drains.
P3: the OTP path (web, relay-otp, worker-otp, consumer, webhook) while project B's OTPs arrive alone at B2o's rate:
    an OTP costs about twice a bulk message (B2o's breakdown per process kind), and this says where.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from . import profile
from .backlog import bulk_accept, live_key
from .context import Context
from .launcher import ROOT
from .loadgen import post_load
from .scenarios.b1_accept import SEND_PATH, send_body

OUT = ROOT / "artifacts" / "bench" / "profiles"


def _pids(ctx: Context, *names: str) -> dict[str, int]:
    return {name: ctx.stack.processes[name].pid for name in names if ctx.stack.processes[name].alive()}


def _files(stem: str, pids: dict[str, int]) -> list[Path]:
    return [OUT / f"{stem}-{pid}.txt" for pid in pids.values()]


def run(ctx: Context) -> dict[str, Any]:
    if profile.py_spy() is None:
        return {"error": "py-spy is not installed (make install; pinned in requirements/dev.in)"}
    seconds = ctx.sizes.profile_seconds
    for old in OUT.glob("*.txt"):
        old.unlink()
    out: dict[str, Any] = {}

    ctx.fresh()
    ctx.stack.stop_process("relay")
    ctx.stack.stop_process("relay-otp")
    try:
        web = _pids(ctx, "web")
        load = threading.Thread(target=post_load, args=(ctx.stack.web_url + SEND_PATH, send_body(ctx.world.a.recipients[0]),
                                                      ctx.sizes.b1_connections, seconds + 2),
                                kwargs={"token": ctx.world.a.live_key, "idempotency": True})
        load.start()
        profile.finish(profile.record(list(web.values()), seconds, OUT / "p1-web"))
        load.join()
        out["P1 web (B1 funnel)"] = profile.summarise(_files("p1-web", web))
    finally:
        ctx.stack.start_process("relay")
        ctx.stack.start_process("relay-otp")

    time.sleep(3)  # the restarted relay's start-up (imports, checks) is not the hot path
    ctx.fresh()
    names = ("relay", "worker-otp", "worker-utility", "worker-marketing", "consumer", "webhook")
    pids = _pids(ctx, *names)
    world = ctx.world
    per_lane = max(1, ctx.sizes.b2_messages // 3)
    fleet = [i.name for i in world.fleet]
    for category in ("OTP", "UTILITY", "MARKETING"):
        bulk_accept(world.a.project, live_key(world.a.project), world.a.recipients, per_lane, category, instances=fleet)
    time.sleep(1)  # sample the steady drain, not the first release
    samplers = {name: profile.record([pid], seconds, OUT / f"p2-{name}") for name, pid in pids.items()}
    for procs in samplers.values():
        profile.finish(procs)
    for name, pid in pids.items():
        out[f"P2 {name} (B2 pipeline)"] = profile.summarise([OUT / f"p2-{name}-{pid}.txt"])
    ctx.fresh()
    out.update(otp_stream_profiles(ctx, seconds))
    return out


def otp_stream_profiles(ctx: Context, seconds: float) -> dict[str, Any]:
    from .scenarios.b3_otp_latency import OtpStream

    names = ("web", "relay-otp", "worker-otp", "consumer", "webhook")
    pids = _pids(ctx, *names)
    # The pass before left events in flight (the consumer's prefetch, the simulator's posts): they land now,
    # not in the profile (P2's stopped drain left 2,000 receipts that found no message).
    time.sleep(5)
    ctx.fresh()
    rate = ctx.sizes.b2_otp_rate or 20.0
    with OtpStream(ctx, rate):
        time.sleep(2)  # past the first OTPs: their receipts arrive while later ones are sent, as in B2o
        samplers = {name: profile.record([pid], seconds, OUT / f"p3-{name}", gil=True) for name, pid in pids.items()}
        for procs in samplers.values():
            profile.finish(procs)
    ctx.fresh()
    return {f"P3 {name} ({rate:g} OTP/s alone, GIL holders only)": profile.summarise([OUT / f"p3-{name}-{pid}.txt"])
            for name, pid in pids.items()}
