"""S1: schemathesis (property-based, positive and negative data) against /v1/schema/ with a valid
live key: no server error, and every answer inside the schema (status code, content type, body)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..context import Context

FAULT = "schemathesis {version}, {examples} examples per operation, positive and negative data"
MUST = "0 server errors, 0 responses outside the schema"
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def _version() -> str:
    from importlib.metadata import version

    return version("schemathesis")


def run(ctx: Context) -> dict[str, Any]:
    ctx.fresh()
    st = Path(sys.executable).with_name("st")
    with tempfile.TemporaryDirectory(prefix="chaos-st-") as tmp:
        junit = Path(tmp) / "junit.xml"
        argv = [str(st), "run", f"{ctx.stack.web_url}/v1/schema/", "--url", ctx.stack.web_url,
                "-H", f"Authorization: Bearer {ctx.world.a.live_key}", "--checks", CHECKS,
                "--max-examples", str(ctx.sizes.s1_examples), "--seed", "8", "--workers", "2",
                "--phases", "examples,coverage,fuzzing", "--generation-database", "none", "--no-color",
                "--request-timeout", "20", "--report", "junit", "--report-junit-path", str(junit),
                "--output-sanitize", "true", "--suppress-health-check", "all"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        report = junit.read_text() if junit.exists() else ""
    out = done.stdout + done.stderr
    tests = sum(int(n) for n in re.findall(r'<testsuite[^>]*\btests="(\d+)"', report)) or None
    failures = len(re.findall(r"<failure", report))
    errors = len(re.findall(r"<error", report))
    server_errors = len(re.findall(r"Server error", out))
    outside = len(re.findall(r"(?:Response violates schema|Undocumented HTTP status code|Undocumented Content-Type)", out))
    summary = [line.strip() for line in out.splitlines() if re.search(r"(passed|failed|errored|generated|Test cases)", line)][-6:]
    failing_ops = sorted(set(re.findall(r"^_+ ((?:GET|POST|PUT|PATCH|DELETE) \S+) _+$", out, re.M)))
    figures = {"operations": tests, "failing_operations": failing_ops, "junit_failures": failures,
               "junit_errors": errors, "server_error_findings": server_errors,
               "outside_schema_findings": outside, "exit_code": done.returncode, "summary": summary}
    notes = []
    if done.returncode != 0:
        excerpt = "\n".join(out.splitlines()[-60:])
        notes.append("schemathesis output (tail):\n" + excerpt)
    return {"passed": done.returncode == 0, "fault": FAULT.format(version=_version(), examples=ctx.sizes.s1_examples),
            "must": MUST, "figures": figures, "notes": notes, "raw_output_tail": json.dumps(out[-8000:])}
