"""The report's rows and appendices of the scenarios against the gateway's pace: B7 (callback deliveries) and
B8 (a slow gateway, typing on). The rest of the page is bench/report.py."""

from __future__ import annotations

import math
from typing import Any

from .report_format import num, per_unit_table, spread, status


def _row_b7(b7: dict[str, Any]) -> list[str]:
    per = (b7["runs"][0]["cpu_ms_per_delivery"] if b7["runs"] else {}) or {}
    return [f"| B7 | {spread(b7['deliveries_per_s'])} callback deliveries/s (steady window; first to last "
            f"{spread(b7['first_to_last_per_s'])}/s) from the status changes of {b7['messages']:,} messages; CPU per "
            f"delivery: callbacks worker {num(per.get('callbacks'), 2)} ms, machine {num(per.get('machine'), 2)} ms; "
            f"all delivered, signatures OK: {'yes' if b7['all_delivered'] else 'NO'} "
            f"| trivial tasks {spread(b7['baseline_tasks_per_s'])} /s | {num(b7['ratio'], 2)}× "
            "| none stated (issue 23) | report only |"]


def gateway_priority(result: dict[str, Any], scenario: str, starved: str, otherwise: str = "") -> str:
    """At what priority the simulator ran, for the scenarios that raise it (B3, B8; `gateway_cpu`): `starved` says
    what it did at the stack's share of the cores; `otherwise` ends the sentence when it could not be raised."""
    if result.get("gateway_nice"):
        return (f"The simulator ran at nice {result['gateway_nice']} (its session's autogroup too) for {scenario}: the "
                f"real gateway has machines of its own, and at the stack's share of the two cores {starved}.")
    if "gateway_nice" in result:
        return ("The simulator's CPU weight could not be raised (that takes root): it shares the two cores at the "
                f"stack's priority{otherwise}.")
    return ""


def _b8_gateway(b8: dict[str, Any]) -> str:
    return gateway_priority(b8, "B8", "its event loop served the OTPs' calls up to 0.8 s late (p99); how late it "
                                      "still ran is in the second table",
                            ", and how late its event loop ran is in the second table")


def _b8_bar(b8: dict[str, Any], r: dict[str, Any] | None = None) -> tuple[float, str]:
    """What B8's throughput (run `r`'s, or the runs' as a whole) is judged against: the caps, or the measured CPU
    ceiling where lower."""
    caps = b8["runs"][0]["pacing_caps_per_s"] if b8["runs"] else float("nan")
    if "bar_per_s" not in b8:  # a run from before the ceiling was measured
        return caps, f"sum of pacing caps {num(caps)}/s"
    if "ceilings" in b8:  # a ceiling right before each judged run and one after the last
        ceilings = [c["throughput_per_s"] for c in b8["ceilings"]]
        if r is not None and r.get("ceilings_around"):
            before, after = (ceilings[i] for i in r["ceilings_around"])
            return r["bar_per_s"], (f"lower of the caps ({num(caps)}/s) and the CPU ceiling (the mean of "
                                    f"{num(before, 1)}/s just before and {num(after, 1)}/s just after)")
        return b8["bar_per_s"], (f"lower of the caps ({num(caps)}/s) and the CPU ceiling (the mean of "
                                 + ", ".join(f"{num(c, 1)}/s" for c in ceilings) + ")")
    ceiling = b8["ceiling"]["throughput_per_s"]
    if "ceiling_after" in b8:
        after = b8["ceiling_after"]["throughput_per_s"]
        return b8["bar_per_s"], (f"lower of the caps ({num(caps)}/s) and the CPU ceiling (the mean of "
                                 f"{num(ceiling, 1)}/s first and {num(after, 1)}/s last)")
    return b8["bar_per_s"], f"lower of the caps ({num(caps)}/s) and the CPU ceiling ({num(ceiling, 1)}/s)"


def _b8_otp(r: dict[str, Any]) -> str:
    """The OTP p99 as judged (the simulator's own lateness taken off each call) and as measured."""
    if r.get("otp_p99_punctual_ms") is None:  # a run from before the punctual figure
        return f"{num(r['otp_p99_ms'])} ms"
    return f"{num(r['otp_p99_punctual_ms'])} ms with the simulator's lateness taken off (measured {num(r['otp_p99_ms'])} ms)"


def _row_b8(b8: dict[str, Any]) -> list[str]:
    rows = []
    for r in b8["runs"]:
        if r["pool"] != "threads":
            continue
        _, bar_text = _b8_bar(b8, r)
        old = next((o for o in b8["runs"] if o["pool"] == "prefork" and o["latency_s"] == r["latency_s"]), None)
        share = r.get("share_of_bar", r["share_of_caps"])
        rows.append(f"| B8 | at {num(r['latency_s'], 1)} s latency, typing on: {num(r['throughput_per_s'], 1)} UTILITY/s "
                    f"(prefork: {num(old['throughput_per_s'], 1) if old else '–'}/s); OTP p99 {_b8_otp(r)} "
                    f"| {bar_text}; OTP ≤ {r['otp_target_ms']} ms "
                    f"| {num(share, 2)}× | ≥ 0.8×; OTP p99 ≤ latency + typing + 250 ms "
                    f"| {status(r['throughput_met'] and r['otp_met'])} |")
    return rows


def _appendix_b7(b7: dict[str, Any], results: dict[str, Any]) -> list[str]:
    trim = 100 * b7.get("steady_trim", 0.1)
    out = [f"Each run: the trivial-task baseline (B2's), then {b7['messages']:,} messages through B2's pipeline (bulk "
           "accept, a third per lane, over A's fleet) to all READ with a `message.status` endpoint of A registered at a "
           "receiver in the bench process (200 at once; the first and every 25th signature checked) while the callbacks "
           "relay pass is held back; then the relay pass ticks every `CALLBACKS_RELAY_SECONDS`, as beat does, and the "
           "deliveries owed (one per status line) drain through the callbacks worker "
           f"({b7.get('callbacks_worker_threads', '?')} threads). Rate at the receiver: the steady window leaves out the "
           f"first and last {trim:.0f} % of the arrivals (the first pass's ramp, the tail); from the first tick includes "
           "the first derivation. A relay pass hands out at most "
           f"{num(b7.get('release_ceiling_per_s'))} deliveries per second (`RELEASE_BATCH` a pass, one pass a tick): "
           "about the path's own ceiling. CPU from the first tick to the last arrival, servers included; the receiver is in "
           "the bench process (in `machine` only). No target is stated for B7: reported, not judged.", "",
           "| run | trivial tasks/s | deliveries/s steady | first to last | from first tick | received / owed / written "
           "| attempts (failed) | duplicates | signatures checked (bad) | relay ticks |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(b7["runs"]):
        d, rt = r["deliveries"], r["rates"]
        out.append(f"| {i + 1} | {num(r['baseline_tasks_per_s'])} | {num(rt['steady'])} | {num(rt['first_to_last'])} "
                   f"| {num(rt['from_start'])} | {r['received']:,} / {r['owed']:,} / {d['written']:,} "
                   f"| {d['attempts']:,} ({d['failed_attempts']}) | {r['duplicates']} "
                   f"| {r['signatures_checked']} ({r['bad_signatures']}) | {r['relay_ticks']} |")
    out.append("")
    if b7["runs"]:
        first = b7["runs"][0]
        got, ceiling = callbacks_core(first)
        out += [f"In run 1 the callbacks worker had {num(100 * got)} % of one core (its CPU seconds over the drain's "
                f"wall time); at its CPU per delivery one core would deliver about {num(ceiling)}/s (one process: "
                "Python's GIL keeps its threads to one core). A rate well under that was held back by the machine, "
                "not by the callbacks path.", ""]
        out += per_unit_table("CPU milliseconds per unit of work in run 1 (all cores): one trivial task against one "
                               "callback delivery (derived, released, claimed, signed, posted, recorded).",
                               {"per trivial task": first["cpu_ms_per_task"],
                                "per delivery": first["cpu_ms_per_delivery"]})
    return out


def callbacks_core(run: dict[str, Any]) -> tuple[float, float]:
    """A B7 run's callbacks worker: the share of one core it had during the drain, and the deliveries per second
    one core would make at its CPU per delivery (NaN when not measured)."""
    wall = run.get("cpu", {}).get("wall_s") or 0
    seconds = run.get("cpu_s", {}).get("callbacks")
    per_ms = run.get("cpu_ms_per_delivery", {}).get("callbacks")
    got = seconds / wall if seconds is not None and wall else math.nan
    return got, (1000 / per_ms if per_ms else math.nan)


_CEILINGS_AROUND = ("in the same run right before each threads run and once after the last (the table below, in the "
                    "order they ran); each threads run is judged against the lower of the caps and the mean of the "
                    "two ceilings on either side of it, the prefork runs shown against the mean of them all")


def _appendix_b8(b8: dict[str, Any], results: dict[str, Any]) -> list[str]:
    typing_s = b8["text_chars"] * int(b8["typing"]["TYPING_DELAY_MS_PER_CHAR"]) / 1000
    out = [f"{b8['messages']:,} UTILITY messages ({b8['text_chars']} characters: about {typing_s:.1f} s of typing) "
           f"queued over {b8['instances']} instances at the default pacing, an OTP stream of {num(b8['otp_rate'])}/s "
           f"alongside, each run {num(b8['window_s'])} s; throughput counted from when the first sends could be back "
           "(latency + the longest typing + 1 s) to the end. The simulator answers sendText after the latency. The "
           "lane workers run each pool in turn; the summary judges the threads pool (the product's). The CPU ceiling "
           "is the same scenario on the threads pool with nothing to wait on (latency 0, typing off), measured "
           + (_CEILINGS_AROUND if "ceilings" in b8 else f"first {'and last ' if 'ceiling_after' in b8 else ''}in the "
              f"same run; each run is judged against {_b8_bar(b8)[1]}") + ". " + _b8_gateway(b8), "",
           "| pool | latency | UTILITY sent/s | × bar | sendText in flight (max) | OTP p50 / p99 | peak RSS worker "
           "| peak DB connections (worker / all) | machine busy |", "|---|---|---|---|---|---|---|---|---|"]
    if "ceilings" in b8:
        runs = sorted(b8["ceilings"] + b8["runs"], key=lambda r: r["seq"])
    else:
        runs = (([{**b8["ceiling"], "pool": "threads (ceiling: typing off)"}] if "ceiling" in b8 else []) + b8["runs"]
                + ([{**b8["ceiling_after"], "pool": "threads (ceiling again)"}] if "ceiling_after" in b8 else []))
    for r in runs:
        conns = r["peak_db_connections"]
        out.append(f"| {r['pool']} | {num(r['latency_s'], 1)} s | {num(r['throughput_per_s'], 1)} "
                   f"| {num(r.get('share_of_bar', r['share_of_caps']), 2)} | {r['max_in_flight']} | {num(r['otp_p50_ms'])} / "
                   f"{num(r['otp_p99_ms'])} ms | {num(r['peak_rss_mb'].get('worker'))} MB "
                   f"| {conns.get('worker', 0)} / {sum(conns.values())} | {num(r['cpu'].get('machine_busy_share'), 2)} |")
    phased = [r for r in runs if r.get("otp_phases_ms")]
    if phased:
        names = ("release", "to_call", "call", "after_call")
        out += ["", "Where an OTP's accept → SENT went, p50 / p99 ms: the relay's release (accept → dispatched), the wait "
                "for a lane thread and its claim (→ the call's start), the call to Evolution (latency + typing), the "
                "SENT write after it; then the call as the simulator served it (its handler's time) and how much of "
                "that went beyond the latency and typing asked for (the simulator's event loop running late). The OTP "
                "target is judged on each OTP's accept → SENT less that lateness on its own call: the time it would "
                "have taken had the stand-in answered when asked (our side's time, and a call's wait for the "
                "simulator to start handling it, stay in).", "",
                "| pool | latency | " + " | ".join(names) + " | served at the simulator | of which late |",
                "|---|---|" + "---|" * (len(names) + 2)]
        for r in phased:
            cells = [f"{num(r['otp_phases_ms'][n]['p50'])} / {num(r['otp_phases_ms'][n]['p99'])}"
                     if n in r["otp_phases_ms"] else "–" for n in names]
            gw = r.get("otp_at_gateway_ms") or {}
            cells += [f"{num(gw.get('served_p50'))} / {num(gw.get('served_p99'))}" if gw else "–",
                      f"{num(gw.get('late_p50'))} / {num(gw.get('late_p99'))}" if gw else "–"]
            out.append(f"| {r['pool']} | {num(r['latency_s'], 1)} s | " + " | ".join(cells) + " |")
    return out + [""]
