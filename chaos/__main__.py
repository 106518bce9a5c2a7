"""`python -m chaos`: start the real stack on a chaos database, run the fault and abuse scenarios,
write docs/reliability.md with the figures of this run.

    python -m chaos                         # every scenario, full sizes (~15 min on 2 cores, R9's 10-min receiver
                                            # outage, and R11's two compressed weeks, ~13 min)
    python -m chaos --only R1,S3            # a subset
    python -m chaos --smoke --out X.md      # small sizes (tests/chaos runs this)
    python -m chaos --set r4_messages=2000

Sizes: chaos/sizes.py (env CHAOS_<NAME> or --set name=value). Exit status 1 when a row fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .sizes import resolve

ROOT = Path(__file__).resolve().parents[1]
# In the order they run: S5 searches the tables and logs every other row left, so it runs last.
SCENARIOS = ("R1", "R2", "R3", "R4", "R5", "R6", "R7", "R8", "R8I", "R9", "R10", "R11", "S1", "S2", "S3", "S4", "S6", "S7", "S8", "S5")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios (default: all)")
    p.add_argument("--smoke", action="store_true", help="small sizes and short outages")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override one size")
    p.add_argument("--out", default=str(ROOT / "docs" / "reliability.md"), help="the Markdown report")
    p.add_argument("--json", default=None, help="raw results (default: artifacts/chaos/results.json)")
    return p.parse_args(argv)


def setup_django(database_url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "pilot_status.settings"
    os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def run_once_more_after_outside_restart(scenario: Any, ctx: Any) -> dict[str, Any]:
    """Run a scenario; when a shared server was restarted under it by someone else (other engineers'
    fault tests share Postgres/RabbitMQ on this machine), run it once more and say so."""
    from django.db import OperationalError, connection

    try:
        return scenario(ctx)
    except (OperationalError, OSError) as exc:
        print(f"chaos: a shared service went away under the run ({exc}); running the scenario once more", flush=True)
        traceback.print_exc(limit=4)
        connection.close()
        time.sleep(5)
        result = scenario(ctx)
        result.setdefault("notes", []).append(f"run twice: the first run lost a shared service to an outside restart ({exc})")
        return result


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    only = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    if unknown := set(only) - set(SCENARIOS):
        raise SystemExit(f"--only: unknown scenario(s) {', '.join(sorted(unknown))}")
    sizes = resolve(args.smoke, args.set)
    # The stack's logs (S5 greps them): PS_TEST_LOG_DIR when set, else artifacts/logs; always a chaos/ folder.
    base_logs = Path(os.environ.get("PS_TEST_LOG_DIR") or ROOT / "artifacts" / "logs")
    log_dir = base_logs / ("chaos-smoke" if args.smoke else "chaos")
    os.environ["PS_TEST_LOG_DIR"] = str(log_dir)
    json_path = Path(args.json) if args.json else ROOT / "artifacts" / "chaos" / ("smoke.json" if args.smoke else "results.json")

    from .world import build_world, chaos_database_url, ensure_database

    database_url = chaos_database_url()
    ensure_database(database_url)
    setup_django(database_url)

    from django.conf import settings

    from . import report
    from .context import Context
    from .scenarios import PLAN
    from .stack import start_stack

    results: dict[str, Any] = {"sizes": sizes.__dict__, "smoke": args.smoke, "scenarios": {}, "errors": {},
                               "database": database_url.rsplit("/", 1)[1], "log_dir": str(log_dir),
                               "cpus": os.cpu_count(), "load_before": [round(x, 2) for x in os.getloadavg()]}
    started = time.monotonic()
    stack = sim = proxy = None
    try:
        stack, sim, proxy = start_stack()
        settings.EVOLUTION_API_URL = sim.base_url  # the harness's own status sync and instance poll
        # and its ingestion reconciler's forwards (the default, port 8001, is no one's here: every forward
        # of an unprocessed event failed with "connection refused" and the safety net did nothing)
        settings.INTERNAL_WEBHOOK_URL = stack.webhook_url
        settings.STATUS_SYNC_AFTER_SECONDS = 10
        world = build_world()
        ctx = Context(stack, sim, proxy, world, sizes, log=lambda line: print(line, flush=True))
        for name in SCENARIOS:
            if name not in only:
                continue
            print(f"chaos: {name} …", flush=True)
            t = time.monotonic()
            try:
                results["scenarios"][name] = run_once_more_after_outside_restart(PLAN[name], ctx)
            except Exception:
                results["errors"][name] = traceback.format_exc()
                print(results["errors"][name], file=sys.stderr, flush=True)
                results["scenarios"][name] = {"passed": False, "figures": {}, "notes": ["the scenario crashed: see errors"]}
            results["scenarios"][name]["elapsed_s"] = round(time.monotonic() - t, 1)
            verdict = "pass" if results["scenarios"][name]["passed"] else "FAIL"
            print(f"chaos: {name} {verdict} in {results['scenarios'][name]['elapsed_s']} s: "
                  f"{json.dumps(results['scenarios'][name]['figures'], default=str)[:600]}", flush=True)
    finally:
        if stack is not None:
            stack.stop()
        if proxy is not None:
            proxy.stop()
        if sim is not None:
            sim.stop()
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results["load_after"] = [round(x, 2) for x in os.getloadavg()]
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2, default=str))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report.render(results))
    print(f"chaos: done in {results['elapsed_s']} s; wrote {args.out} and {json_path}", flush=True)
    failed = [n for n, r in results["scenarios"].items() if not r["passed"]]
    return 1 if failed or results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
