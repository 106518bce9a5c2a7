"""The report's rows for B2, the pipeline (bench/scenarios/b2_pipeline.py): its summary row, row M (the peak RSS
sampled during it), row B2o (another tenant's OTPs alongside), and its appendix."""

from __future__ import annotations

from typing import Any

from .report_format import num, per_unit_table, spread, status


def _row_b2(b2: dict[str, Any]) -> list[str]:
    return [f"| B2 | SENT {spread(b2['sent_rate'])} msg/s; READ {spread(b2['read_rate'])} msg/s "
            f"({b2['messages']:,} messages) | trivial tasks {spread(b2['baseline_tasks_per_s'])} /s "
            f"| {num(b2['ratio'], 2)}× | SENT ≥ 0.35× | {status(b2['met'])} |"]


def _row_b2_otps(b2: dict[str, Any]) -> list[str]:
    w = b2.get("with_otps")
    if not w:
        return []
    return [f"| B2o | SENT {spread(w['sent_rate'])} msg/s with another tenant's {num(w['otp_rate'])} OTP/s alongside; "
            f"the OTPs' own work takes {spread(_pct(w['otp_cpu_share']))} % of the machine "
            f"| B2 alone, the run just before | {spread(w['ratio'], 2)}× (of the CPU the OTPs left: "
            f"{spread(w['kept_of_left'], 2)}×) | ≥ 0.5× (issue 25 §3: not halved) | {status(w['met'])} |"]


def _pct(s: dict[str, Any]) -> dict[str, Any]:
    return {k: ([100 * x for x in v] if k == "runs" else 100 * v) for k, v in s.items()}


def _row_m(b2: dict[str, Any]) -> list[str]:
    rss = b2["peak_rss_mb"]
    return [f"| M | peak RSS during B2: worker {num(rss.get('worker'))} MB, web {num(rss.get('web'))} MB, "
            f"webhook {num(rss.get('webhook'))} MB, relay {num(rss.get('relay'))} MB, consumer "
            f"{num(rss.get('consumer'))} MB, simulator {num(rss.get('simulator'))} MB | – | – "
            f"| worker ≤ 150 MB, web (both pools) ≤ 120 MB | {status(b2['rss_met'])} |"]


def _appendix_b2(b2: dict[str, Any], results: dict[str, Any]) -> list[str]:
    out = [f"{b2['messages']:,} messages (a third per lane) written by the bulk accept path; clock from its commit. "
           "Baseline: trivial Celery tasks on the same broker, in the same run.", "",
           "| run | trivial tasks/s | SENT/s | READ/s | all SENT | all READ | sim sendText | sim CPU (of one core) |",
           "|---|---|---|---|---|---|---|---|"]
    base_runs = b2["baseline_tasks_per_s"].get("runs") or []
    for i, r in enumerate(b2["runs"]):
        out.append(f"| {i + 1} | {num(base_runs[i] if i < len(base_runs) else None)} | {num(r['sent_rate'])} "
                   f"| {num(r['read_rate'])} | {r['all_sent']} ({num(r['sent_s'], 1)} s) | {r['all_read']} "
                   f"({num(r['read_s'], 1)} s) | {r['simulator_send_text']['total']:,} "
                   f"| {100 * r['simulator_cpu_share']:.0f} % |")
    out.append("")
    first = b2["runs"][0]
    if first.get("cpu_ms_per_message"):
        out += per_unit_table(
            "CPU milliseconds per unit of work in run 1 (all cores): one trivial task against one message from its "
            "accept to READ (its send, its four events on both channels, the relay's and the servers' share).",
            {"per trivial task": first["cpu_ms_per_task"], "per message": first["cpu_ms_per_message"]})
    if alone := b2.get("sends_alone"):
        emitted = alone["receipts_emitted"]
        out += [f"Sends alone, the send path's measured ceiling (one more run with the simulator's receipts off): "
                f"SENT {num(alone['sent_rate'])}/s, {num(alone['ratio'], 2)}× the last baseline run, "
                f"{num(alone['cpu_ms_per_message'].get('machine'), 1)} ms of machine CPU per message (receipts "
                f"emitted meanwhile: {emitted['webhook']} webhooks, {emitted['rabbitmq']} RabbitMQ events)."
                + (" The send path alone is already under the target, so B2 cannot be met on this machine by "
                   "making the receipts cheaper." if alone["ratio"] < 0.35 else ""), ""]
    if w := b2.get("with_otps"):
        out += _appendix_b2_otps(w)
    out += ["Peak RSS per process (sampled every 0.5 s during run 1; row M of the summary): "
            + ", ".join(f"{k} {num(v)} MB" for k, v in b2["peak_rss_mb"].items()) + ".", ""]
    return out


def _appendix_b2_otps(w: dict[str, Any]) -> list[str]:
    out = [f"Row B2o: right after each run above, the same pipeline again with project B's OTPs arriving at "
           f"{num(w['otp_rate'])}/s through the HTTP API until it ends. Between the two, the OTP stream alone for "
           f"{num(w.get('otp_alone_seconds'))} s: the CPU per second it adds to the idle stack (our processes', the simulator's "
           "and our own servers', not the load generator's; measured during the stream, less as long idle just "
           "before), over the machine's cores, is the share of the machine the OTPs' own work takes. On a CPU-bound machine that share is gone for B2 whatever the product does; \"of "
           "what they left\" is the ratio over (1 − share), an estimate (CPU per unit of work moves with the host's "
           "phases).", "",
           "| run | SENT/s alone | SENT/s with OTPs | ratio | OTPs sent | OTP p99 | CPU per OTP | OTPs' share "
           "of the machine | of what they left |", "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(w["runs"]):
        out.append(f"| {i + 1} | {num(r['alone_sent_rate'])} | {num(r['sent_rate'])} | {num(r['ratio'], 2)}× "
                   f"| {r['otps']:,}{'' if r['otps_all_sent'] else ' (not all)'} | {num(r['otp_p99_ms'])} ms "
                   f"| {num(r['otp_cpu_ms'])} ms | {num(100 * r['otp_cpu_share'])} % | {num(r['kept_of_left'], 2)}× |")
    kinds = [r.get("otp_alone", {}).get("cpu_ms_by_kind") for r in w["runs"]]
    if any(kinds):
        out += ["", "Where an OTP's CPU went, the stream alone (ms per OTP by process kind, each run; a kind can read "
                    "below zero by noise):", ""]
        for i, by_kind in enumerate(kinds):
            if by_kind:
                out.append(f"- run {i + 1}: " + ", ".join(f"{kind} {num(ms, 1)}" for kind, ms in
                                                           sorted(by_kind.items(), key=lambda item: -item[1])))
    return out + [""]
