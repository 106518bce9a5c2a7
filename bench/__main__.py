"""`python -m bench`: start the real stack on a bench database, run the scenarios, write the report.

    python -m bench                       # full run, writes docs/benchmarks.md (about 40 min on 2 cores)
    python -m bench --only B1,B3          # a subset
    python -m bench --smoke --out X.md    # tiny sizes (tests/bench/test_bench_smoke.py)
    python -m bench --set b2_messages=20000 --set runs=5
    python -m bench --ablation            # each device of issue 25 off alone (bench/ablation.py)
    python -m bench --ablation --variants list | --variants ack-batch,priorities --rounds 3
    python -m bench --paired              # the accept path's devices on and off in one process (bench/paired.py)

Sizes: bench/sizes.py (env BENCH_<NAME> or --set name=value).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .launcher import ROOT, BenchStack, StackConfig
from .launcher import STARTED, launcher_description
from .launcher import priorities as launcher_priorities
from .sizes import resolve

SCENARIOS = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9")
# The runs docs/benchmarks.md is rendered from, kept in the repository (tests/bench/test_report.py renders them).
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios (default: all)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: proves the harness works, measures nothing")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override one size")
    p.add_argument("--out", default=None, help="the Markdown report (default: docs/benchmarks.md; with --ablation, "
                                                "the table next to its JSON, artifacts/bench/ablation.md)")
    p.add_argument("--json", default=None, help="raw results (default: artifacts/bench/results.json, or ablation.json)")
    p.add_argument("--ablation", action="store_true",
                   help="the ablation table: each device switched off alone, interleaved (bench/ablation.py);\n"
                        "--set then names bench/ablation.py's sizes (rounds, b2_messages, ...)")
    p.add_argument("--variants", default="", help='with --ablation: "list", or comma-separated variants (default: all)')
    p.add_argument("--rounds", type=int, default=0, help="with --ablation: rounds over the variants (default 2)")
    p.add_argument("--paired", action="store_true",
                   help="the accept path's devices on and off alternating in this process, no stack (bench/paired.py);\n"
                        "--rounds (default 8) and --set accepts=N (per block, default 1000)")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")
    p.add_argument("--report-only", action="store_true", help="only render --out from the results JSON")
    p.add_argument("--ablation-json", default=None,
                   help="put the ablation table of this JSON (a `--ablation` run's) into the report, with its own date")
    p.add_argument("--paired-json", default=None,
                   help="put the paired table of this JSON (a `--paired` run's) into the report, with its own date")
    p.add_argument("--keep", action="store_true",
                   help="keep the scenarios (and profiles) of the previous results JSON that this run does not redo")
    # As the Procfile's web: WEB_CONCURRENCY (scripts/env.sh: one per core).
    p.add_argument("--web-workers", type=int, default=int(os.environ.get("BENCH_WEB_WORKERS")
                                                          or os.environ.get("WEB_CONCURRENCY") or len(os.sched_getaffinity(0))))
    p.add_argument("--web-args", default=os.environ.get("BENCH_WEB_ARGS", ""),
                   help='extra gunicorn flags, e.g. "--worker-class gthread --threads 4"')
    # Unset: each lane's own (pilot_status.lane_worker, as in the Procfile); a number sets every lane's.
    p.add_argument("--worker-concurrency", type=int, default=int(os.environ.get("BENCH_WORKER_CONCURRENCY") or 0) or None)
    p.add_argument("--worker-pool", choices=("threads", "prefork"), default=os.environ.get("BENCH_WORKER_POOL") or None,
                   help="the lane workers' Celery pool (default: LANE_WORKER_POOL's, threads)")
    return p.parse_args(argv)


def setup_django(database_url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["DATABASE_URL"] = database_url
    # B3 and B7 register an endpoint on loopback (bench.callbacks_on); the stack's processes get the same (launcher).
    os.environ["CALLBACKS_ALLOW_PRIVATE_ADDRESSES"] = "true"
    os.environ["PILOT_TEST_STACK"] = "1"  # production mode refuses the line above elsewhere (pilot_status/production.py)
    import django

    django.setup()


def with_ablation(results: dict[str, Any], path: str | None, paired: str | None = None) -> dict[str, Any]:
    """The results, with the ablation run at `path` (and the paired run at `paired`) beside them (each measures
    in its own run, so its table names its own machine and load)."""
    if path:
        results = {**results, "ablation": json.loads(Path(path).read_text())}
    return {**results, "paired": json.loads(Path(paired).read_text())} if paired else results


def kept_results(ablation: str | None, paired: str | None) -> tuple[Path, str | None, str | None]:
    """The runs docs/benchmarks.md is rendered from (bench/results/): the full run's, and the ablation's and the
    paired run's where they are kept (an explicit --ablation-json or --paired-json wins)."""
    def kept(name: str) -> str | None:
        return str(RESULTS / name) if (RESULTS / name).exists() else None

    return RESULTS / "results.json", ablation or kept("ablation.json"), paired or kept("paired.json")


def paired_main(args: argparse.Namespace) -> int:
    from . import paired

    if not paired.DEVICES:
        raise SystemExit("--paired: no device has a switch to measure (bench/paired.py DEVICES); the last paired "
                         "run is kept in bench/results/paired.json")
    from .world import bench_database_url, build_world, ensure_database, migrate

    # As the bench stack's web (bench.launcher): the key's rate limit is not what is measured.
    os.environ.update(RATE_LIMIT_PER_SECOND="1000000", RATE_LIMIT_BURST="1000000")
    database_url = bench_database_url()
    ensure_database(database_url)
    setup_django(database_url)
    migrate()
    from . import machine

    sizes = dict(item.partition("=")[::2] for item in args.set)
    count = int(sizes.pop("accepts", 1000 if not args.smoke else 20))
    if sizes:
        raise SystemExit(f"--set: with --paired only accepts=N is known, not {', '.join(sizes)}")
    rounds = args.rounds or (8 if not args.smoke else 2)
    world = build_world(fleet=3)
    result = {"machine": machine.describe(), **paired.run(world, rounds, count)}
    json_path = Path(args.json or ROOT / "artifacts" / "bench" / "paired.json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1))
    out = Path(args.out or ROOT / "artifacts" / "bench" / "paired.md")
    out.write_text(paired.render(result))
    print(paired.render(result))
    print(f"bench: wrote {json_path} and {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.ablation:
        from . import ablation

        return ablation.main(args, setup_django)
    if args.paired:
        return paired_main(args)
    args.out = args.out or str(PAGE)
    only = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"--only: unknown scenario(s) {', '.join(sorted(unknown))}")
    sizes = resolve(args.smoke, args.set)
    log_dir = Path(os.environ.get("PS_TEST_LOG_DIR") or ROOT / "artifacts" / "logs") / "bench"
    json_path = Path(args.json) if args.json else ROOT / "artifacts" / "bench" / ("smoke.json" if args.smoke else "results.json")
    if Path(args.out).resolve() == PAGE.resolve() and not args.smoke:
        # The page and the runs it is rendered from stay together in the repository.
        kept_json, args.ablation_json, args.paired_json = kept_results(args.ablation_json, args.paired_json)
        json_path = json_path if args.json else kept_json

    from .world import bench_database_url, build_world, ensure_database, migrate

    if args.report_only:
        from . import report

        Path(args.out).write_text(report.render(with_ablation(json.loads(json_path.read_text()), args.ablation_json, args.paired_json)))
        print(f"bench: wrote {args.out} from {json_path}")
        return 0
    previous = json.loads(json_path.read_text()) if args.keep and json_path.exists() else None
    database_url = bench_database_url()
    ensure_database(database_url)
    setup_django(database_url)
    migrate()

    from . import machine, report
    from .context import DISTURBANCES, Context
    from .scenarios import b1_accept, b2_pipeline, b3_otp_latency, b4_outage, b5_ingestion, b6_fairness, b7_callbacks
    from .scenarios import b8_slow_gateway, b9_human_pace
    from .world import Simulator

    world = build_world(fleet=sizes.fleet)
    stack = BenchStack(StackConfig(database_url, web_workers=args.web_workers,
                                   worker_concurrency=args.worker_concurrency, worker_pool=args.worker_pool,
                                   log_dir=log_dir,
                                   web_args=args.web_args.split()))
    results: dict[str, Any] = {"machine": machine.describe(), "sizes": sizes.__dict__, "smoke": args.smoke,
                               "stack": {"web_workers": args.web_workers,
                                         "worker_concurrency": {lane: stack.lane_worker(lane).concurrency for lane in ("otp", "utility", "marketing")},
                                         "worker_pool": stack.lane_worker("utility").pool,
                                         "web_args": args.web_args,
                                         "webhook_args": f"{stack.config.webhook_workers} workers, "
                                                         + " ".join(stack.config.webhook_args),
                                         "priorities": {name: nice for name, nice in launcher_priorities(dict(os.environ)).items()
                                                        if name in STARTED}},
                               "scenarios": {}, "errors": {}}
    # Stop the stack on SIGTERM/SIGINT too (a background job ignores SIGINT by default).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    started = time.monotonic()
    print(f"bench: load before start {results['machine']['load_before']}; database {database_url.rsplit('/', 1)[1]}",
          flush=True)
    try:
        stack.start()
        results["stack"]["launcher"] = launcher_description()
        ctx = Context(stack, Simulator(stack.simulator_url), world, sizes,
                      log=lambda line: print(line, flush=True))
        plan = {
            "B1": lambda: b1_accept.run(ctx),
            "B2": lambda: b2_pipeline.run(ctx),
            "B3": lambda: b3_otp_latency.run(ctx),
            "B4": lambda: b4_outage.run(ctx),
            "B5": lambda: b5_ingestion.run(ctx),
            "B6": lambda: b6_fairness.run(ctx),
            "B7": lambda: b7_callbacks.run(ctx),
            "B8": lambda: b8_slow_gateway.run(ctx),
            "B9": lambda: b9_human_pace.run(ctx),
        }
        for name in SCENARIOS:
            if name not in only:
                continue
            print(f"bench: {name} …", flush=True)
            for dead in stack.revive():
                print(f"bench: {dead} had died; restarted it", flush=True)
                results.setdefault("revived", []).append(f"{dead} before {name}")
            for attempt in (1, 2):
                t = time.monotonic()
                DISTURBANCES.clear()
                try:
                    results["scenarios"][name] = plan[name]()
                    results["scenarios"][name]["elapsed_s"] = round(time.monotonic() - t, 1)
                    if DISTURBANCES:
                        results.setdefault("disturbed", {})[name] = list(DISTURBANCES)
                    results["errors"].pop(name, None)
                    break
                except Exception:
                    # Shared machines: a service restarted by someone else's test breaks a run. Retry
                    # once on fresh connections; the report lists what was retried.
                    results["errors"][name] = traceback.format_exc()
                    print(results["errors"][name], file=sys.stderr, flush=True)
                    results.setdefault("retried", {})[name] = results["errors"][name].strip().splitlines()[-1]
                    from django.db import connections

                    connections.close_all()
                    time.sleep(3)
                    for dead in stack.revive():
                        results.setdefault("revived", []).append(f"{dead} during {name}")
            _save(results, json_path, previous)
        if sizes.profile_seconds > 0 and not args.no_profile:
            from . import profiling

            print("bench: profiles …", flush=True)
            try:
                results["profiles"] = profiling.run(ctx)
            except Exception:
                results["errors"]["profiles"] = traceback.format_exc()
                print(results["errors"]["profiles"], file=sys.stderr, flush=True)
    finally:
        stack.stop()
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    if previous is not None:
        _keep_previous(results, previous)
    results["machine"]["load_after"] = machine.load()
    _save(results, json_path)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report.render(with_ablation(results, args.ablation_json, args.paired_json)))
    print(f"bench: done in {results['elapsed_s']} s; wrote {args.out} and {json_path}", flush=True)
    return 1 if results["errors"] else 0


def _save(results: dict[str, Any], path: Path, previous: dict[str, Any] | None = None) -> None:
    """Written after every scenario too, so a crash late in the run keeps what was measured. With `--keep` (the
    previous run's results, which this file held) the scenarios not measured yet are written from them, marked kept:
    a crash then loses none of them from the file it overwrites."""
    if previous is not None:
        results = {**results, "scenarios": dict(results["scenarios"]), "kept": dict(results.get("kept", {}))}
        _keep_previous(results, previous)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str))


def _keep_previous(results: dict[str, Any], previous: dict[str, Any]) -> None:
    """Fill in what this run did not measure from the previous run, saying so in the report."""
    when = previous.get("machine", {}).get("date", "?")
    measured = previous.get("kept", {})  # what the previous run had kept itself: the date it was measured
    for name, figures in previous.get("scenarios", {}).items():
        if name not in results["scenarios"] and name not in results["errors"]:
            results["scenarios"][name] = figures
            results.setdefault("kept", {})[name] = measured.get(name, when)
    if "profiles" not in results and previous.get("profiles"):
        results["profiles"] = previous["profiles"]
        results.setdefault("kept", {})["profiles"] = measured.get("profiles", when)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
