"""S6 (amplification and memory) and S7 (the fuzz) of the chaos harness, on tiny sizes, on the real stack.

`python -m chaos --smoke` runs S6 and S7 in the run test_chaos_smoke.py reads (tests/chaos/conftest.py), on
its own stack (gunicorn web, plus the webhook pool these two rows start next to it) and a database of its own:
it posts unauthenticated junk at both pools while it reads every worker's RSS, and runs the hypothesis fuzz
over the webhook, the internal forward, the client API and the dashboard forms. The first two tests check the harness itself (it measured every
worker, it reached every target); the others are the rows' verdicts, as in test_chaos_smoke.py. The
full sizes run in `make chaos` (docs/reliability.md).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chaos.conftest import ABUSE_ROWS as SUBSET

# The harness run is tests/chaos/conftest.py's, shared with test_chaos_smoke.py (its timeout says why 960 s).
pytestmark = [pytest.mark.timeout(960), pytest.mark.harness, pytest.mark.stack]


@pytest.fixture(scope="module")
def run(chaos_run: dict[str, Any]) -> dict[str, Any]:
    return chaos_run


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
