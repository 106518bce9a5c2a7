"""Render docs/reliability.md from one run's results (figures are this run's, never edited by hand).

The Findings section is chaos/findings.md, included verbatim: the defects the runs found and the test
that holds each, what is still open, and what was noticed and left alone; kept next to the harness so a
re-run never drops them, and cut to what is true now (the diagnoses are in git).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FINDINGS = Path(__file__).with_name("findings.md")
HEADLINE = {
    "R1": ("answers", "lost", "final"),
    "R2": ("answers", "status_changes_applied_during_outage", "relay_consumer_same_process", "lost"),
    "R3": ("answers_not_503_json", "stored_during_outage", "messages_without_accepted_event",
           "first_202_after_restart_s", "processes_restarted", "lost"),
    "R4": ("kills", "lost", "duplicate_sendtext_calls", "most_calls_for_one_message", "final"),
    "R5": ("web_restarts", "webhook_failed", "ghost_statuses", "final"),
    "R6": ("cases", "right", "lost"),
    "R7": ("kills", "lost", "duplicate_accepted_sends", "statuses_applied_twice", "final"),
    "R8": ("ids", "events_lost", "messages", "answers", "answers_lost_after_send", "answers_lost_before_send", "sent_or_later_reached_once",
           "wrong", "ends", "lost", "most_reached_for_one_message", "checks", "settled_by_receipts",
           "messages_left_unknown_a_while", "outcome_unknown"),
    "R9": ("sends", "lost", "down_s", "callbacks_owed", "callbacks_lost", "last_callback_not_final", "bad_signatures",
           "catch_up_s", "otp_p99_ms", "otp_ratio"),
    "R10": ("sends", "lost", "duplicate_sendtext_calls", "queue_consumers", "second_beat_exit_status",
            "c_callbacks_owed", "c_callbacks_lost", "accepted_per_web_pool", "inbox_rows_by_channel", "fairness_ratio"),
    "R11": ("policy_sent", "policy_ended", "policy_lost", "policy_strikes_463", "policy_disconnects", "policy_restricted",
            "off_sent", "off_ended", "off_lost", "off_strikes_463", "off_disconnects", "off_banned", "off_restricted"),
    "S1": ("operations", "server_error_findings", "outside_schema_findings", "exit_code"),
    "S2": ("calls", "answered_as_expected", "a_unchanged"),
    "S3": ("calls", "answered_401", "inbox_rows_added", "target_status_after"),
    "S4": ("calls", "as_expected", "server_errors"),
    "S5": ("secrets_checked", "tables_searched", "logs_searched", "tables_holding_a_secret", "logs_holding_a_secret"),
    "S6": ("requests", "server_errors", "max_growth_mb", "over_bound", "workers_replaced", "workers"),
    "S7": ("examples", "server_errors", "distinct_failures", "statuses"),
    "S8": ("c_p99_ratio", "a_most_in_flight", "a_cap", "a_attempts_cut_at_deadline", "a_longest_attempt_ms",
           "lookup_answers", "lookup_longest_s", "read_answers", "reads_alone_p99_s", "reads_during_p99_s"),
}


def _row_order(name: str) -> tuple[str, int, str]:
    """R1, R2, …, R8, R8I, …, R10: rows by letter, then by number (a plain sort puts R10 before R2), then variant."""
    digits = "".join(ch for ch in name[1:] if ch.isdigit())
    return name[0], int(digits) if digits else 0, name[1 + len(digits):]


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value) or "none"
    return str(value)


def render(results: dict[str, Any]) -> str:
    sc = results["scenarios"]
    lines = [
        "# Reliability: faults and abuse on the real stack",
        "",
        "Written by `make chaos` (`python -m chaos`) from the run below; every figure is this run's. "
        + ("**Smoke run (small sizes): it proves the harness, not the product.**" if results.get("smoke") else ""),
        "",
        "Faults are real: `scripts/services.sh stop|start` really stops Redis, RabbitMQ and Postgres; processes are "
        "killed with SIGKILL (their whole process group); the gateway's answers are changed through the simulator's "
        "control API; link faults (a black-holed connection, a slow link) come from `chaos/proxy.py`, an asyncio TCP "
        "proxy the stack reaches Evolution through. \"Lost\" = accepted with 202 but not final (DELIVERED/READ, or "
        "FAILED with a dead letter) when the scenario's drain time ran out.",
        "",
        "Maintenance: no beat in the chaos stack (R10 runs one of its own, with two of each maintenance worker, for "
        "its row only). The harness calls the plain one-pass functions every 2 s while it "
        "drains — `messaging.reconciler.run_batch`, `messaging.status_sync.run_batch` (STATUS_SYNC_AFTER_SECONDS=10 "
        "in the harness), `messaging.sending.instance_state.poll_waiting` and `ingestion.reconciler.run_batch` "
        "(stale after 15 s) — as beat would with shorter periods.",
        "",
        "| id | fault | must show | figures from this run | result |",
        "|---|---|---|---|---|",
    ]
    for name in sorted(sc, key=_row_order):
        r = sc[name]
        figs = r.get("figures", {})
        headline = HEADLINE.get(name) or HEADLINE.get(name.rstrip("I"), ())  # R8I: R8's figures
        shown = "; ".join(f"{k}: {_fmt(figs[k])}" for k in headline if k in figs)
        verdict = "pass" if r.get("passed") else "**FAIL**"
        lines.append(f"| {name} | {r.get('fault', '')} | {r.get('must', '')} | {shown} | {verdict} |")
    lines += ["", f"Run: {results.get('elapsed_s')} s in all on {results.get('cpus')} CPUs (load average before "
              f"{results.get('load_before')}, after {results.get('load_after')}: other engineers' test runs share the "
              f"machine and the servers); database `{results.get('database')}`; stack logs in `{results.get('log_dir')}`.", "", "Sizes: `" + json.dumps(results.get("sizes", {})) + "` "
              "(chaos/sizes.py; `--set name=value` or env `CHAOS_<NAME>`).", ""]
    lines += ["## Details", ""]
    for name in sorted(sc, key=_row_order):
        r = sc[name]
        lines += [f"### {name} — {'pass' if r.get('passed') else 'FAIL'} ({r.get('elapsed_s', '?')} s)", ""]
        figs = dict(r.get("figures", {}))
        matrix = figs.pop("matrix", None)
        for k, v in figs.items():
            lines.append(f"- {k}: {_fmt(v)}")
        if matrix:
            lines += ["", "| case | expected | ends | attempts | sendText calls (Evolution's answers) | right |",
                      "|---|---|---|---|---|---|"]
            for case, row in matrix.items():
                lines.append(f"| {case} | {row['expected']} | {_fmt(row['ends'])} | {_fmt(row['attempts'])} | "
                             f"{row['sendtext_calls']} ({_fmt(row.get('evolution_answered', {}))}) | {'yes' if row['ok'] else '**no**'} |")
        for note in r.get("notes", []):
            lines += ["", "```", note, "```"] if "\n" in note else ["", f"Note: {note}"]
        if name in results.get("errors", {}):
            lines += ["", "```", results["errors"][name][-3000:], "```"]
        lines.append("")
    lines += ["## Findings", ""]
    lines += [FINDINGS.read_text().strip() if FINDINGS.exists() else "None."]
    return "\n".join(lines) + "\n"
