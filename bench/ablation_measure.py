"""The ablation's measurement of one variant in one round (bench/ablation.py runs the rounds): B1, B5, B3 and B2
at small sizes, taken from the scenarios' own code, and the CPU of our processes and our own servers."""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# ---------------------------------------------------------------------------------------------------------
# CPU of this stack and of its own servers only: the shared host runs other clones' servers too.
# ---------------------------------------------------------------------------------------------------------

def own_server_roots(env: dict[str, str] | None = None) -> dict[str, list[int]]:
    """Our Postgres (the parent of a backend we connect to at DATABASE_URL), Redis (its port) and RabbitMQ (its
    epmd port, AMQP + 2 as scripts/services.sh lays them out) among the machine's servers. Found through the URLs,
    not the checkout's path: a bench run from a git worktree uses the servers of the checkout that started them."""
    from .procstats import server_roots

    env = dict(os.environ if env is None else env)
    redis_port = str(urlparse(env.get("REDIS_URL", "")).port or "")
    amqp_port = urlparse(env.get("CELERY_BROKER_URL", "")).port
    epmd = str(amqp_port + 2) if amqp_port else ""
    postmaster = postmaster_pid(env.get("DATABASE_URL", ""))
    own: dict[str, list[int]] = {}
    for kind, pids in server_roots().items():
        for pid in pids:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if kind == "postgres":
                mine = pid == postmaster
            elif kind == "redis":
                mine = bool(redis_port) and argv[0].endswith(f":{redis_port}")
            else:
                mine = bool(epmd) and "-epmd_port" in argv and argv[argv.index("-epmd_port") + 1] == epmd
            if mine:
                own.setdefault(kind, []).append(pid)
    return own


def own_meter(ctx: Any) -> Any:
    """A CpuMeter over our processes (the simulator among them) and our own servers: not the load generator, not
    other clones'."""
    from .procstats import CpuMeter

    return CpuMeter({**ctx.roots(), **own_server_roots()})


def cpu_seconds(meter: Any) -> float:
    """A meter's CPU seconds over every kind it counted."""
    return sum(meter.by_kind.values())


def postmaster_pid(database_url: str) -> int | None:
    """The Postgres server at `database_url`: the parent process of the backend that serves our connection."""
    import psycopg

    if not database_url:
        return None
    try:
        with psycopg.connect(database_url, connect_timeout=5) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            # Read while the connection is open: once it closes, the backend exits and its /proc entry goes.
            status = Path(f"/proc/{backend}/status").read_text()
    except (psycopg.Error, OSError):
        return None
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), None)


def _ratio(value: float | None, base: float | None) -> float:
    if value is None or base is None or not base or math.isnan(base) or math.isnan(value):
        return math.nan
    return value / base


def cpu_ms_per_unit(meter: Any, count: int) -> dict[str, float]:
    """Per unit: each kind's, `stack` (ours and our servers together) and `machine` (every busy CPU)."""
    if count <= 0:
        return {}
    per = {kind: round(1000 * seconds / count, 2) for kind, seconds in sorted(meter.by_kind.items())}
    per["stack"] = round(1000 * cpu_seconds(meter) / count, 2)
    per["machine"] = round(1000 * meter.machine_busy / count, 2)
    return per


# ---------------------------------------------------------------------------------------------------------
# One variant, one round
# ---------------------------------------------------------------------------------------------------------

def measure_b1(ctx: Any) -> dict[str, Any]:
    """B1 as bench/scenarios/b1_accept.py measures it (relay stopped, every 202 a stored row), one run each."""
    import requests

    from messaging.models import Message

    from .loadgen import post_load
    from .procstats import CpuMeter
    from .scenarios.b1_accept import BASELINE_PATH, SEND_PATH, _as_dict, send_body
    from .world import empty_tables

    sizes = ctx.sizes
    body = send_body(ctx.world.a.recipients[0])
    auth = {"Authorization": f"Bearer {ctx.world.a.live_key}"}
    ctx.stack.stop_process("relay")
    ctx.stack.stop_process("relay-otp")
    try:
        empty_tables()
        # Warm every gunicorn worker (URLconf, views, connections), as B1's warm_up, shorter.
        session = requests.Session()
        for _ in range(4 * ctx.stack.config.web_workers):
            session.post(ctx.stack.web_url + BASELINE_PATH, json=body, timeout=60)
            session.post(ctx.stack.web_url + SEND_PATH, json=body, headers=auth, timeout=60)
        post_load(ctx.stack.web_url + BASELINE_PATH, body, sizes.b1_connections, 1)
        post_load(ctx.stack.web_url + SEND_PATH, body, sizes.b1_connections, 1, token=ctx.world.a.live_key)
        empty_tables()
        roots = {**ctx.roots(), **own_server_roots()}
        with CpuMeter(roots) as base_cpu:
            base = post_load(ctx.stack.web_url + BASELINE_PATH, body, sizes.b1_connections, sizes.b1_seconds)
        empty_tables()
        with CpuMeter(roots) as funnel_cpu:
            funnel = post_load(ctx.stack.web_url + SEND_PATH, body, sizes.b1_connections, sizes.b1_seconds,
                               token=ctx.world.a.live_key, idempotency=True)
        stored = Message.objects.count() >= funnel.requests - funnel.errors
        empty_tables()
    finally:
        ctx.stack.start_process("relay")
        ctx.stack.start_process("relay-otp")
    cpu = {"baseline": cpu_ms_per_unit(base_cpu, base.requests), "funnel": cpu_ms_per_unit(funnel_cpu, funnel.requests)}
    return {"baseline": _as_dict(base), "funnel": _as_dict(funnel), "every_202_stored": stored,
            "ratio": _ratio(funnel.rate, base.rate), "p99_ratio": _ratio(funnel.p99_ms, base.p99_ms),
            "cpu_ms_per_request": cpu,
            "cpu_ratio": _ratio(cpu["funnel"].get("stack"), cpu["baseline"].get("stack"))}


def measure_b5(ctx: Any, baseline_before: float) -> dict[str, Any]:
    """One B5 run (bench/scenarios/b5_ingestion.py), against B1's bare insert before and one more after."""
    from .scenarios import b5_ingestion

    run = b5_ingestion.one_run(ctx, ctx.sizes.b5_events)
    after, _ = b5_ingestion.baseline(ctx)
    base = (baseline_before + after) / 2
    correct = run["inbox_rows"] == run["inbox_processed"] == run["messages_delivered"] == run["events"]
    return {"rate": run["rate"], "baseline_before_after": [round(baseline_before, 1), round(after, 1)],
            "ratio": _ratio(run["rate"], base), "correct": correct, "all_copies_handled": run["all_copies_handled"]}


def measure_b3(ctx: Any) -> dict[str, Any]:
    """One idle and one busy stream (bench/scenarios/b3_otp_latency.py)."""
    from .scenarios import b3_otp_latency

    idle = b3_otp_latency.one_run(ctx, 0)
    busy = b3_otp_latency.one_run(ctx, ctx.sizes.b3_backlog)
    # The backlog is still draining: the relay's passes hold the outbox's and messages' locks, and on a loaded
    # host the next TRUNCATE lost every try to them. Stopped, the tables empty at once.
    ctx.stack.stop_process("relay")
    try:
        ctx.fresh()
    finally:
        ctx.stack.start_process("relay")
    return {"idle_p99_ms": idle["p99_ms"], "busy_p99_ms": busy["p99_ms"], "idle_p50_ms": idle["p50_ms"],
            "busy_p50_ms": busy["p50_ms"], "ratio": _ratio(busy["p99_ms"], idle["p99_ms"]),
            "backlog_left": busy.get("backlog_left"), "all_sent": idle["all_sent"] and busy["all_sent"]}


def measure_b2(ctx: Any, otp_rate: float) -> dict[str, Any]:
    """B2's pipeline (bench/scenarios/b2_pipeline.py) twice: alone, with its CPU per message; then with another
    tenant's OTP stream at `otp_rate` alongside (b3's otp_stream), from the bulk accept until READ."""
    from .scenarios import b2_pipeline
    from .scenarios.b3_otp_latency import OtpStream

    count = ctx.sizes.b2_messages
    ctx.fresh()
    with own_meter(ctx) as meter:
        alone = b2_pipeline.pipeline(ctx, count)
    ctx.fresh()
    stream = OtpStream(ctx, otp_rate)
    with stream:
        with_otps = b2_pipeline.pipeline(ctx, count)
    otp = stream.latencies()
    return {"sent_rate": alone["sent_rate"], "read_rate": alone["read_rate"],
            "all_read": alone["all_read"], "cpu_ms_per_message": cpu_ms_per_unit(meter, count),
            "with_otps": {"otp_rate": otp_rate, "sent_rate": with_otps["sent_rate"], "read_rate": with_otps["read_rate"],
                          "all_read": with_otps["all_read"], "otps": len(stream.ids), "otp_p99_ms": otp.get("p99_ms"),
                          "otps_all_sent": otp.get("all_sent"), "stream_error": stream.error},
            "with_otps_ratio": _ratio(with_otps["sent_rate"], alone["sent_rate"])}


def measure(ctx: Any, sizes: Any, log: Callable[[str], None], slot: dict[str, Any]) -> dict[str, Any]:
    """Fills `slot` part by part, so that a failure late in it keeps what was measured."""
    attempt(ctx, slot, "fresh", ctx.fresh, log)
    b1 = slot["b1"] = attempt(ctx, slot, "B1", lambda: measure_b1(ctx), log)
    log(f"    B1 {b1['ratio']:.2f}× (p99 {b1['p99_ratio']:.2f}× the bare insert's)")
    b5 = slot["b5"] = attempt(ctx, slot, "B5", lambda: measure_b5(ctx, b1["baseline"]["rate"]), log)
    log(f"    B5 {b5['ratio']:.2f}×")
    b3 = slot["b3"] = attempt(ctx, slot, "B3", lambda: measure_b3(ctx), log)
    log(f"    B3 {b3['ratio']:.2f}× (p99 {b3['busy_p99_ms']:.0f} vs {b3['idle_p99_ms']:.0f} ms idle)")
    b2 = slot["b2"] = attempt(ctx, slot, "B2", lambda: measure_b2(ctx, sizes.b2_otp_rate), log)
    log(f"    B2 {b2['cpu_ms_per_message'].get('stack', math.nan):.1f} ms CPU/msg; SENT {b2['sent_rate']:.0f}/s, "
        f"{b2['with_otps']['sent_rate']:.0f}/s with {sizes.b2_otp_rate:g} OTP/s alongside")
    return slot


def attempt(ctx: Any, slot: dict[str, Any], name: str, part: Callable[[], Any], log: Callable[[str], None]) -> Any:
    """One part of a slot, tried again once on fresh connections after a failure (as `python -m bench` does a
    scenario: a shared host's load or a restarted server breaks a run); the slot lists what was retried."""
    from django.db import connections

    started = time.monotonic()
    try:
        return part()
    except Exception:
        failure = traceback.format_exc()
        log(failure)
        slot.setdefault("retried", {})[name] = failure.strip().splitlines()[-1]
        connections.close_all()
        time.sleep(3)
        for dead in ctx.stack.revive():
            slot.setdefault("revived", []).append(f"{dead} during {name}")
        return part()
    finally:
        # Where a slot's time goes: what to shrink (--set) when the whole ablation must be shorter.
        slot.setdefault("seconds", {})[name] = round(time.monotonic() - started, 1)
