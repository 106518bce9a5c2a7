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
import json
import os
import re
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from .launcher import ROOT, BenchStack, StackConfig, launcher_description
from .sizes import Sizes
from .ablation_measure import measure
from .ablation_table import PLACEBO, REFERENCE, render, summarize


@dataclass(frozen=True)
class Variant:
    key: str  # what --variants takes
    device: str  # the row's name in the table
    env: dict[str, str]  # the switch (empty: all on)


# One switch per device, "off" = the plain Django/DRF/Celery way.
VARIANTS = (
    Variant(REFERENCE, "all on (today)", {}),
    Variant("priorities", "process priorities", {"BACKGROUND_NICE": "0"}),  # the launcher's nice
    Variant("slices", "systemd slices (nice kept)", {"LAUNCH_SLICES": "0"}),
    Variant("metrics-carry", "metrics carry", {"METRICS_FLUSH_SECONDS": "0"}),
    Variant("ack-batch", "batched consumer ACKs", {"CONSUMER_ACK_BATCH": "1"}),
    # A switch no code reads: today's product in one more slot a round. How far its figures move from all on's is
    # how far the host moves identical code between slots; a device's change must be larger to count.
    Variant(PLACEBO, "nothing (placebo)", {"ABLATION_PLACEBO": "1"}),
)


@dataclass(frozen=True)
class AblationSizes:
    """One variant's measurement in one round. The defaults keep the 10 variants × 2 rounds near half an hour on
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
    # Non-zero: the simulator at this nice for the whole slot (B8's gateway_cpu), a gateway with CPU of its own
    # rather than one starved by the stack it serves on this 2-core host (issue 25 §3's trial).
    gateway_nice: int = 0

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
    e.g. `env:RELAY_LANE_DEPTH_OTP=32`."""
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


PRODUCT_SOURCES = ("messaging", "ingestion", "pilot_status", "dashboard", "simulator", "bench/launcher.py", "Procfile",
                   "scripts/launch.sh")


def read_by_product(name: str, root: Path = ROOT) -> bool:
    """Whether any product source (or the launchers, which read BACKGROUND_NICE and LAUNCH_SLICES) names the switch."""
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    for source in PRODUCT_SOURCES:
        path = root / source
        files = [path] if path.is_file() else path.rglob("*.py") if path.is_dir() else []
        if any(pattern.search(f.read_text(errors="replace")) for f in files):
            return True
    return False



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
            from .scenarios.b8_slow_gateway import gateway_cpu

            with gateway_cpu(ctx, sizes.gateway_nice) if sizes.gateway_nice else nullcontext(False) as raised:
                if sizes.gateway_nice:
                    slot["gateway_nice"] = sizes.gateway_nice if raised else 0
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
        "machine": {**machine.describe(), "launcher": launcher_description()}, "sizes": asdict(sizes), "smoke": args.smoke,
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
