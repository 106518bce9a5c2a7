"""One run of the chaos harness (chaos/) for both test files: `python -m chaos --smoke` with the rows each
file reads, on a database of its own.

The harness starts a whole stack (gunicorn, relay, consumer, lane workers, the simulator behind chaos' TCP
proxy), migrates its database and builds its world before the first row: about 25 s on the 2-core CI
host. One run serves test_chaos_smoke.py's rows and test_chaos_abuse_smoke.py's S6 and S7 instead of a run
per file. The rows run in the harness's own order (chaos/__main__.py), S5 last as in `make chaos`: it
searches the logs of every other row, S6's and S7's too.
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
# test_chaos_smoke.py: service stop, SIGKILL, web restart, gateway, lost answers, scale-out, the campaign of a new
# number under the ban model, and every abuse row
SMOKE_ROWS = ("R1", "R4", "R5", "R6", "R8", "R8I", "R10", "R11", "S1", "S2", "S3", "S4", "S5")
# test_chaos_abuse_smoke.py: amplification and memory, and the fuzz
ABUSE_ROWS = ("S6", "S7")
# Smaller than --smoke's own sizes for S6 and S7 (only theirs): the tests only have to keep the two rows working.
ABUSE_TINY = ("s6_requests=150", "s6_warmup=60", "s7_examples=8", "s7_budget_s=90")


@pytest.fixture(scope="session")
def chaos_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("chaos")
    env = dict(os.environ)
    env["CHAOS_DATABASE_NAME"] = f"{env.get('TEST_DATABASE_NAME', 'test_pilot_status')}_chaos_smoke"
    argv = [sys.executable, "-m", "chaos", "--smoke", "--only", ",".join(SMOKE_ROWS + ABUSE_ROWS),
            "--out", str(out / "reliability.md"), "--json", str(out / "results.json")]
    for size in ABUSE_TINY:
        argv += ["--set", size]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert (out / "results.json").exists(), done.stdout[-3000:] + done.stderr[-5000:]
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    results["report"] = (out / "reliability.md").read_text()
    results["output"] = done.stdout[-4000:] + done.stderr[-4000:]
    return results
