"""`python -m bench --ablation`: what each device still buys, measured with it switched off alone (issue 25).

Every device of issue 25 has an environment switch (the agreed names are in VARIANTS). A variant is a whole
stack started with one switch off ("all on" is today's product); each variant gets the same short
measurement, taken from the scenarios' own code at small sizes:

- B1: the funnel's accept rate and p99 against the bare DRF insert, measured one after the other in the
  same stack (relay stopped, as in B1);
- B5: unique events/s against the bare insert measured right before (B1's) and right after it;
- B3: the OTP stream's p99 behind a marketing backlog against the same stream idle;
- B2: CPU milliseconds per message from the bulk accept to READ (our processes and our own servers), and
  SENT/s without and then with an OTP stream of another tenant alongside (issue 25 §3: does a growing OTP
  stream halve everyone else's throughput?).

The variants run round-robin, R rounds, each round starting one variant later, so a slow phase of a shared
host falls on every variant alike; each figure is the median of its rounds with min–max. Each ratio is
taken inside one stack run (a figure and its baseline a few seconds apart), never across variants.

A switch the product does not read yet changes nothing: its row is then measurement noise, and the
table says so rather than giving it a verdict.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .launcher import ROOT, BenchStack, StackConfig
from .sizes import Sizes
from .ablation_table import REFERENCE, render, summarize


@dataclass(frozen=True)
class Variant:
    key: str  # what --variants takes
    device: str  # the row's name in the table
    env: dict[str, str]  # the switch (empty: all on)


# /work/ablation-switches.md: one switch per device, "off" = the plain Django/DRF/Celery way.
VARIANTS = (
    Variant(REFERENCE, "all on (today)", {}),
    Variant("one-statement", "one-statement accept", {"ACCEPT_ONE_STATEMENT": "0"}),
    Variant("remembered-routing", "remembered routing guards", {"ACCEPT_REMEMBER_ROUTING": "0"}),
    Variant("prepared", "prepared statements", {"DATABASE_PREPARED_STATEMENTS": "0"}),
    Variant("plain-validator", "second validator", {"SEND_PLAIN_VALIDATOR": "0"}),
    Variant("priorities", "process priorities", {"BACKGROUND_NICE": "0"}),
    Variant("metrics-carry", "metrics carry", {"METRICS_FLUSH_SECONDS": "0"}),
    Variant("ack-batch", "batched consumer ACKs", {"CONSUMER_ACK_BATCH": "1"}),
    Variant("gateway-limit", "adaptive gateway limit", {"GATEWAY_ADAPTIVE_LIMIT": "0"}),
)


@dataclass(frozen=True)
class AblationSizes:
    """One variant's measurement in one round. The defaults keep 9 variants × 2 rounds near 25 minutes on
    the 2-core host; each can be set by env (BENCH_ABLATION_<NAME>) or `--set name=value`."""

    rounds: int = 2
    fleet: int = 60                # project A's instances, as in the bench
    b1_seconds: float = 5.0        # one wrk run (bare insert, funnel, and B5's baseline after)
    b1_connections: int = 16
    b2_messages: int = 400         # bulk accepted, a third per lane, to READ
    b2_otp_rate: float = 20.0      # issue 25 §3: the OTP stream alongside B2's second run
    b3_backlog: int = 3_000        # still draining when the stream ends (it drains at ~100/s here)
    b3_otps: int = 60              # measured; fewer than 100 samples make the p99 the slowest
    b3_otp_rate: float = 8.0
    b3_warmup_otps: int = 8
    b5_events: int = 1_000         # B5's start-up and tail weigh more than at 20,000: a lower ratio, alike for all
    wait_timeout: float = 120.0

    def scenario_sizes(self) -> Sizes:
        """The scenarios' own Sizes, at these sizes and one run each."""
        return replace(Sizes(), runs=1, b1_runs=1, b2_runs=1, b5_runs=1, fleet=self.fleet,
                       b1_seconds=self.b1_seconds, b1_connections=self.b1_connections,
                       b2_messages=self.b2_messages, b3_backlog=self.b3_backlog, b3_otps=self.b3_otps,
                       b3_otp_rate=self.b3_otp_rate, b3_warmup_otps=self.b3_warmup_otps,
                       b5_events=self.b5_events, wait_timeout=self.wait_timeout, profile_seconds=0)


SMOKE = AblationSizes(rounds=1, fleet=3, b1_seconds=1, b1_connections=4, b2_messages=20, b2_otp_rate=5,
                      b3_backlog=20, b3_otps=5, b3_otp_rate=20, b3_warmup_otps=2, b5_events=20, wait_timeout=60)


def resolve_sizes(smoke: bool, overrides: list[str], env: dict[str, str] | None = None) -> AblationSizes:
    env = dict(os.environ if env is None else env)
    sizes = SMOKE if smoke else AblationSizes()
    types = {f.name: type(getattr(sizes, f.name)) for f in fields(sizes)}
    changes: dict[str, Any] = {}
    for name, kind in types.items():
        if raw := env.get(f"BENCH_ABLATION_{name.upper()}"):
            changes[name] = kind(float(raw)) if kind is int else kind(raw)
    for item in overrides:
        name, _, raw = item.partition("=")
        if name not in types:
            raise SystemExit(f"--set {item}: unknown ablation size {name!r}; known: {', '.join(types)}")
        changes[name] = types[name](float(raw)) if types[name] is int else types[name](raw)
    return replace(sizes, **changes)


def select(spec: str) -> list[Variant]:
    """`--variants a,b`: those, after "all on" (every change is measured against it); empty: all. An item
    `env:NAME=VALUE` (several joined by `+`) is a trial of its own: a setting other than its device's switch,
    e.g. `env:GATEWAY_QUEUE_TARGET_MS=20`."""
    known = {v.key: v for v in VARIANTS}
    keys = [k.strip() for k in spec.split(",") if k.strip()] or list(known)
    trials = {k: trial(k) for k in keys if k.startswith("env:")}
    unknown = [k for k in keys if k not in known and k not in trials]
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(known)}, or env:NAME=VALUE")
    return [known[REFERENCE], *(known.get(k) or trials[k] for k in keys if k != REFERENCE)]


def trial(key: str) -> Variant:
    env = dict(item.partition("=")[::2] for item in key.removeprefix("env:").split("+"))
    if not all(re.fullmatch(r"[A-Z][A-Z0-9_]*", name) and value for name, value in env.items()):
        raise SystemExit(f"--variants: {key!r} is not env:NAME=VALUE[+NAME=VALUE]")
    return Variant(key, " ".join(f"{name}={value}" for name, value in env.items()), env)


def listing() -> str:
    return "\n".join(f"{v.key:20} {v.device:28} {' '.join(f'{k}={x}' for k, x in v.env.items()) or '(today)'}"
                     for v in VARIANTS)


def rounds_order(variants: list[Variant], rounds: int) -> list[tuple[int, Variant]]:
    """Round-robin, each round starting one variant later: no variant is always first after a start-up."""
    order = []
    for r in range(rounds):
        shift = r % len(variants)
        order += [(r + 1, v) for v in variants[shift:] + variants[:shift]]
    return order


PRODUCT_SOURCES = ("messaging", "ingestion", "pilot_status", "dashboard", "simulator", "bench/launcher.py", "Procfile")


def read_by_product(name: str, root: Path = ROOT) -> bool:
    """Whether any product source (or the launcher, which reads BACKGROUND_NICE) names the switch."""
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    for source in PRODUCT_SOURCES:
        path = root / source
        files = [path] if path.is_file() else path.rglob("*.py") if path.is_dir() else []
        if any(pattern.search(f.read_text(errors="replace")) for f in files):
            return True
    return False


# ---------------------------------------------------------------------------------------------------------
# CPU of this stack and of its own servers only: the shared host runs other clones' servers too.
# ---------------------------------------------------------------------------------------------------------

def own_server_roots(env: dict[str, str] | None = None) -> dict[str, list[int]]:
    """Our Postgres (its data directory is under this checkout), Redis (its port) and RabbitMQ (its epmd port,
    AMQP + 2 as scripts/services.sh lays them out) among the machine's servers."""
    from .procstats import server_roots

    env = dict(os.environ if env is None else env)
    redis_port = str(urlparse(env.get("REDIS_URL", "")).port or "")
    amqp_port = urlparse(env.get("CELERY_BROKER_URL", "")).port
    epmd = str(amqp_port + 2) if amqp_port else ""
    # services.sh keeps the data in .state/, or (when the servers' users cannot reach the checkout) in a folder
    # named after the checkout's path.
    state_dirs = (str(ROOT / ".state"), f"/var/tmp/pilot-status-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]}")
    own: dict[str, list[int]] = {}
    for kind, pids in server_roots().items():
        for pid in pids:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if kind == "postgres":
                mine = "-D" in argv and argv[argv.index("-D") + 1].startswith(state_dirs)
            elif kind == "redis":
                mine = bool(redis_port) and argv[0].endswith(f":{redis_port}")
            else:
                mine = bool(epmd) and "-epmd_port" in argv and argv[argv.index("-epmd_port") + 1] == epmd
            if mine:
                own.setdefault(kind, []).append(pid)
    return own


def _ratio(value: float | None, base: float | None) -> float:
    if value is None or base is None or not base or math.isnan(base) or math.isnan(value):
        return math.nan
    return value / base


def cpu_ms_per_unit(meter: Any, count: int) -> dict[str, float]:
    """Per unit: each kind's, `stack` (ours and our servers together) and `machine` (every busy CPU)."""
    if count <= 0:
        return {}
    per = {kind: round(1000 * seconds / count, 2) for kind, seconds in sorted(meter.by_kind.items())}
    per["stack"] = round(1000 * sum(meter.by_kind.values()) / count, 2)
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
    from .procstats import CpuMeter
    from .scenarios import b2_pipeline

    count = ctx.sizes.b2_messages
    ctx.fresh()
    with CpuMeter({**ctx.roots(), **own_server_roots()}) as meter:
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


class OtpStream:
    """Project B's OTPs at `rate` in a thread while the block runs: b3's otp_stream, one second's worth at a
    time, each second waited out, so the stream keeps its rate however long the pipeline takes."""

    def __init__(self, ctx: Any, rate: float):
        from .world import World

        # Another tenant's OTPs: b3's helper sends as world.a, so give it a world whose `a` is project B.
        world: World = replace(ctx.world, a=ctx.world.b)
        self.ctx = replace(ctx, world=world)
        self.rate = rate
        self.ids: list[str] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from .scenarios.b3_otp_latency import otp_stream

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
        from .scenarios.b3_otp_latency import latencies

        return latencies(self.ctx, self.ids) if self.ids else {}


def measure(ctx: Any, sizes: AblationSizes, log: Callable[[str], None], slot: dict[str, Any]) -> dict[str, Any]:
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


@contextmanager
def environ(changes: dict[str, str]) -> Iterator[None]:
    """The variant's switch in this process's environment too: the launcher reads some settings (such as
    BACKGROUND_NICE) from it when it starts a process, not from the stack's env."""
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """SIGTERM/SIGINT wait until the block is done: an interrupted stop left a stack's processes running."""
    received: list[int] = []
    saved = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
             for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if received:
            raise KeyboardInterrupt(f"signal {received[0]}")


def run_slot(variant: Variant, config: StackConfig, world: Any, sizes: AblationSizes,
             log: Callable[[str], None]) -> dict[str, Any]:
    from .context import DISTURBANCES, Context
    from .world import Simulator

    started = time.monotonic()
    slot: dict[str, Any] = {}
    DISTURBANCES.clear()
    with environ(variant.env):
        stack = BenchStack(replace(config, extra_env={**config.extra_env, **variant.env},
                                   log_dir=config.log_dir / variant.key))
        try:
            stack.start()
            ctx = Context(stack, Simulator(stack.simulator_url), world, sizes.scenario_sizes(), log=log)
            measure(ctx, sizes, log, slot)
        except Exception:
            slot["error"] = traceback.format_exc()
            log(slot["error"])
            from django.db import connections

            connections.close_all()
        finally:
            with deferred_interrupts():
                stack.stop()
    if DISTURBANCES:
        slot["disturbed"] = list(DISTURBANCES)
    slot["elapsed_s"] = round(time.monotonic() - started, 1)
    return slot


# ---------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------

def main(args: argparse.Namespace, setup_django: Callable[[str], None]) -> int:
    if args.variants == "list":
        print(listing())
        return 0
    variants = select(args.variants or "")
    sizes = resolve_sizes(args.smoke, args.set)
    if args.rounds:
        sizes = replace(sizes, rounds=args.rounds)
    json_path = Path(args.json) if args.json else ROOT / "artifacts" / "bench" / (
        "ablation-smoke.json" if args.smoke else "ablation.json")
    out = Path(args.out) if args.out else json_path.with_suffix(".md")
    if args.report_only:
        return _write(json.loads(json_path.read_text()), json_path, out)

    from . import machine
    from .world import bench_database_url, build_world, ensure_database, migrate

    database_url = bench_database_url()
    ensure_database(database_url)
    setup_django(database_url)
    migrate()
    world = build_world(fleet=sizes.fleet)
    log_dir = Path(os.environ.get("PS_TEST_LOG_DIR") or ROOT / "artifacts" / "logs") / "bench" / "ablation"
    config = StackConfig(database_url, web_workers=args.web_workers, worker_concurrency=args.worker_concurrency,
                         worker_pool=args.worker_pool, log_dir=log_dir, web_args=args.web_args.split())
    results: dict[str, Any] = {
        "machine": machine.describe(), "sizes": asdict(sizes), "smoke": args.smoke,
        "variants": {v.key: {"device": v.device, "env": v.env,
                             "read_by_product": all(read_by_product(name) for name in v.env)} for v in variants},
        "order": [], "slots": {v.key: [] for v in variants},
    }

    def log(line: str) -> None:
        print(line, flush=True)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    started = time.monotonic()
    order = rounds_order(variants, sizes.rounds)
    for n, (round_no, variant) in enumerate(order, 1):
        log(f"ablation: {n}/{len(order)} round {round_no}, {variant.device} "
            f"({' '.join(f'{k}={v}' for k, v in variant.env.items()) or 'all on'}); load {machine.load()}")
        slot = run_slot(variant, config, world, sizes, log)
        slot["round"] = round_no
        results["slots"][variant.key].append(slot)
        results["order"].append(variant.key)
        results["summary"] = {key: summarize(slots) for key, slots in results["slots"].items()}
        results["elapsed_s"] = round(time.monotonic() - started, 1)
        _save(results, json_path)  # after every slot: a crash late in the run keeps what was measured
    results["machine"]["load_after"] = machine.load()
    return _write(results, json_path, out)


def _save(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str))


def _write(results: dict[str, Any], json_path: Path, out: Path) -> int:
    _save(results, json_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(render(results)) + "\n")
    print(f"ablation: wrote {out} and {json_path}", flush=True)
    failed = sum(s["errors"] for s in results.get("summary", {}).values())
    return 1 if failed else 0
