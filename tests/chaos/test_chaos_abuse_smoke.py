"""S6 (amplification and memory) and S7 (the fuzz) of the chaos harness, on tiny sizes, on the real stack.

`python -m chaos --smoke --only S6,S7` starts its own stack (gunicorn web, plus the webhook pool these
two rows start next to it) on a database of its own, posts unauthenticated junk at both pools while
it reads every worker's RSS, and runs the hypothesis fuzz over the webhook, the internal forward, the
client API and the dashboard forms. The first two tests check the harness itself (it measured every
worker, it reached every target); the others are the rows' verdicts, as in test_chaos_smoke.py. The
full sizes run in `make chaos` (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBSET = ("S6", "S7")
# Smaller than --smoke's own sizes: this file only has to keep the two rows working.
TINY = ("s6_requests=150", "s6_warmup=60", "s7_examples=8", "s7_budget_s=90")

# A whole harness run in a subprocess (its own stack, at smoke sizes): about 2.5 minutes on an idle 2-core
# machine, more on a loaded one. pytest.ini's 180 s would interrupt it and leave its stack's processes
# running on the test broker, where they take the next stack tests' tasks; the subprocess's own timeout
# (below) is the bound.
pytestmark = pytest.mark.timeout(960)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("chaos-abuse")
    env = dict(os.environ)
    env["CHAOS_DATABASE_NAME"] = f"{env.get('TEST_DATABASE_NAME', 'test_pilot_status')}_chaos_smoke"
    argv = [sys.executable, "-m", "chaos", "--smoke", "--only", ",".join(SUBSET),
            "--out", str(out / "reliability.md"), "--json", str(out / "results.json")]
    for size in TINY:
        argv += ["--set", size]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert (out / "results.json").exists(), done.stdout[-3000:] + done.stderr[-5000:]
    results = json.loads((out / "results.json").read_text())
    results["report"] = (out / "reliability.md").read_text()
    results["output"] = done.stdout[-4000:] + done.stderr[-4000:]
    return results


def figures_of(run: dict[str, Any], name: str) -> dict[str, Any]:
    assert name not in run["errors"], run["errors"].get(name)
    figures: dict[str, Any] = run["scenarios"][name]["figures"]
    return figures


def row(run: dict[str, Any], name: str) -> dict[str, Any]:
    figures = figures_of(run, name)
    notes = "\n".join(run["scenarios"][name].get("notes", []))[:6000]
    assert run["scenarios"][name]["passed"], json.dumps(figures, indent=1, default=str) + "\n" + notes
    return figures


def test_the_memory_row_reads_every_worker_of_both_pools_before_and_after_the_junk(run):
    figures = figures_of(run, "S6")
    pools = {worker.split()[0] for worker in figures["workers"]}
    assert pools == {"web", "webhook"}, figures["workers"]
    assert figures["requests"] == 150 and not figures["workers_replaced"]


def test_the_fuzz_reaches_every_target_over_http(run):
    figures = figures_of(run, "S7")
    assert len(figures["targets"]) == 8 and all(n > 0 for n in figures["targets"].values()), figures["targets"]


def test_it_keeps_every_web_and_webhook_worker_within_the_memory_bound_under_unauthenticated_junk(run):
    figures = row(run, "S6")
    assert figures["server_errors"] == 0 and not figures["over_bound"]


def test_it_answers_every_fuzzed_webhook_forward_api_and_dashboard_request_without_a_server_error(run):
    figures = row(run, "S7")
    assert figures["server_errors"] == 0 and figures["examples"] > 0


def test_it_writes_a_report_row_for_each(run):
    for name in SUBSET:
        assert f"| {name} |" in run["report"]
