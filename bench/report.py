"""Render the results as docs/benchmarks.md: a summary table, then each scenario's details.

The analysis that needs a person (what the profiles mean, what to change) lives in bench/findings.md
and is included verbatim, so regenerating the figures never loses it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

FINDINGS = Path(__file__).with_name("findings.md")


def num(value: Any, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def spread(s: dict[str, Any], digits: int = 0, unit: str = "") -> str:
    if not s:
        return "–"
    if s["min"] == s["max"] or len(s.get("runs", [])) <= 1:
        return num(s["median"], digits, unit)
    return f"{num(s['median'], digits, unit)} ({num(s['min'], digits)}–{num(s['max'], digits)})"


def status(met: bool | None, measurable: bool = True) -> str:
    if not measurable:
        return "not yet measurable"
    return "**met**" if met else "**not met**"


def _summary(results: dict[str, Any]) -> list[str]:
    sc = results["scenarios"]
    rows = ["| id | figure (median, min–max) | baseline, same run | ratio | target | status |",
            "|---|---|---|---|---|---|"]
    if b1 := sc.get("B1"):
        f = b1["figures"]
        rows.append(f"| B1 | {spread(f['funnel']['rate'])} accepted/s, p99 {spread(f['funnel']['p99_ms'], 1, ' ms')} "
                    f"| bare DRF insert {spread(f['baseline']['rate'])} req/s, p99 {spread(f['baseline']['p99_ms'], 1, ' ms')} "
                    f"| {num(b1['ratio'], 2)}× | ≥ 0.7×, p99 ≤ 25 ms | {status(b1['met'])} |")
    if b2 := sc.get("B2"):
        rows.append(f"| B2 | SENT {spread(b2['sent_rate'])} msg/s; READ {spread(b2['read_rate'])} msg/s "
                    f"({b2['messages']:,} messages) | trivial tasks {spread(b2['baseline_tasks_per_s'])} /s "
                    f"| {num(b2['ratio'], 2)}× | SENT ≥ 0.35× | {status(b2['met'])} |")
    if b3 := sc.get("B3"):
        rows.append(f"| B3 | OTP p99 {spread(b3['backlog_run']['p99_ms'], 0, ' ms')} (p50 {spread(b3['backlog_run']['p50_ms'], 0, ' ms')}) "
                    f"behind {b3['backlog']:,} marketing | idle p99 {spread(b3['idle']['p99_ms'], 0, ' ms')} "
                    f"(p50 {spread(b3['idle']['p50_ms'], 0, ' ms')}) | {num(b3['ratio'], 2)}× | ≤ 1.5× and ≤ 250 ms "
                    f"| {status(b3['met'])} |")
    if b4 := sc.get("B4"):
        cap = f"{num(b4['pacing_cap_per_s'], 1)}/s (`{b4['pacing_cap_setting']}`)" if b4["measurable"] else "no pacing cap configured"
        if b4.get("ceiling_5s"):
            cap += f", burst {b4['pacing_burst']}: at most {num(b4['ceiling_5s'], 1)}/s over 5 s"
        rows.append(f"| B4 | peak {num(b4['peak_calls_per_s_after'], 1)} calls/s per instance after (5-s window; 1-s: "
                    f"{num(b4['peak_calls_per_s_after_1s'], 1)}); {b4['attempts_consumed_during_outage']:,} "
                    f"attempts / {b4['gateway_calls_during_outage']:,} calls during {num(b4['outage_s'])} s outage; drain "
                    f"{num(b4['drain_s'], 1)} s | {cap} | {num(b4['peak_calls_per_s_after'] / (b4.get('ceiling_5s') or b4['pacing_cap_per_s']), 2) + '×' if b4['measurable'] else '–'} "
                    f"| peak ≤ cap (with its burst); attempts ≈ 0 | {status(b4['met'], b4['measurable'])} |")
    if b5 := sc.get("B5"):
        base5 = spread(b5["baseline"]) if "baseline" in b5 else num(b5["baseline_rate"])
        rows.append(f"| B5 | {spread(b5['rate'])} unique events/s ({b5['events']:,} events × 2 channels); correct: "
                    f"{'yes' if b5['correct'] else 'NO'} | bare DRF insert {base5} req/s (around each run) "
                    f"| {num(b5['ratio'], 2)}× | ≥ 0.5× | {status(b5['met'])} |")
    if b6 := sc.get("B6"):
        behind = b6["behind"]
        figure = (f"> {num(b6['timeout_s'])} s (timed out)" if behind["timed_out"]
                  else spread(behind["p99_s"], 2, " s"))
        rows.append(f"| B6 | B's p99 wait {figure} behind {b6['backlog']:,} of A | B alone {spread(b6['alone']['p99_s'], 2, ' s')} "
                    f"| {num(b6['ratio'], 2) + '×' if not behind['timed_out'] else '∞'} | ≤ 2× | {status(b6['met'])} |")
    if b8 := sc.get("B8"):
        for r in b8["runs"]:
            if r["pool"] != "threads":
                continue
            old = next((o for o in b8["runs"] if o["pool"] == "prefork" and o["latency_s"] == r["latency_s"]), None)
            rows.append(f"| B8 | at {num(r['latency_s'], 1)} s latency, typing on: {num(r['throughput_per_s'], 1)} UTILITY/s "
                        f"(prefork: {num(old['throughput_per_s'], 1) if old else '–'}/s); OTP p99 {num(r['otp_p99_ms'])} ms "
                        f"| sum of pacing caps {num(r['pacing_caps_per_s'])}/s; OTP ≤ {r['otp_target_ms']} ms "
                        f"| {num(r['share_of_caps'], 2)}× | ≥ 0.8× caps; OTP p99 ≤ latency + typing + 250 ms "
                        f"| {status(r['throughput_met'] and r['otp_met'])} |")
    if b2:
        rss = b2["peak_rss_mb"]
        rows.append(f"| M | peak RSS during B2: worker {num(rss.get('worker'))} MB, web {num(rss.get('web'))} MB, "
                    f"webhook {num(rss.get('webhook'))} MB, "
                    f"relay {num(rss.get('relay'))} MB, consumer {num(rss.get('consumer'))} MB, simulator "
                    f"{num(rss.get('simulator'))} MB | – | – | worker ≤ 150 MB, web (both pools) ≤ 120 MB | {status(b2['rss_met'])} |")
    for name in ("B1", "B2", "B3", "B4", "B5", "B6", "B8"):
        if name not in sc and name not in results["errors"]:
            rows.append(f"| {name} | not measured in this run | | | | **not measured** |")
    for name, error in results["errors"].items():
        if name == "profiles":
            continue
        rows.append(f"| {name} | failed: `{error.strip().splitlines()[-1][:120]}` | | | | **error** |")
    return rows


def _cpu(name: str, cpu: dict[str, Any]) -> str:
    parts = ", ".join(f"{kind} {100 * share:.0f} %" for kind, share in cpu["share"].items())
    return (f"- {name}: machine busy {100 * (cpu['machine_busy_share'] or 0):.0f} % of {cpu['wall_s']:.0f} s × cores; "
            f"by process kind: {parts}")


def _per_unit_table(caption: str, rows: dict[str, dict[str, float]]) -> list[str]:
    if not rows:
        return []
    kinds = sorted({k for row in rows.values() for k in row if k != "machine"}) + ["machine"]
    out = [caption, "", "| | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    out += [f"| {name} | " + " | ".join(num(row.get(k), 2) for k in kinds) + " |" for name, row in rows.items()]
    return out + [""]


def _details(results: dict[str, Any]) -> list[str]:
    sc = results["scenarios"]
    out: list[str] = []
    if b1 := sc.get("B1"):
        out += ["### B1 accept rate", "",
                f"Load: {b1['tool']}, {b1['connections']} keep-alive connections, {num(b1['seconds_per_run'])} s per run, "
                "runs interleaved (baseline, funnel, funnel without Idempotency-Key, then the baseline again on a second "
                "pool of twice the workers: the cross-check below). The relay is stopped during B1 "
                "so that the pipeline does not share the CPU; every 202 was checked to be a stored message "
                f"({'yes' if b1['every_202_stored'] else 'NO'}).", "",
                "| path | req/s | p50 | p99 | non-2xx/errors |", "|---|---|---|---|---|"]
        labels = {"baseline": "bare DRF insert (bench/baseline)", "funnel": "POST /v1/messages/send + Idempotency-Key",
                  "funnel_no_idempotency_key": "POST /v1/messages/send, no Idempotency-Key",
                  "baseline_wide": f"bare DRF insert on {b1.get('wide_workers', '?')} workers (cross-check)"}
        for name, f in b1["figures"].items():
            out.append(f"| {labels[name]} | {spread(f['rate'])} | {spread(f['p50_ms'], 1, ' ms')} | "
                       f"{spread(f['p99_ms'], 1, ' ms')} | {f['errors']} |")
        out += ["", f"Without the Idempotency-Key the ratio is {num(b1['ratio_no_idempotency_key'], 2)}×.", ""]
        if "ratio_to_best_baseline" in b1:
            out += [f"The pool's size is the one server setting both paths share, and the bare insert may prefer "
                    f"another: against the faster of the bare insert on {results['stack']['web_workers']} workers (the "
                    f"judged baseline) and on {b1['wide_workers']}, the funnel's ratio is "
                    f"{num(b1['ratio_to_best_baseline'], 2)}×.", ""]
        out += _per_unit_table("CPU milliseconds per request in run 1 (all cores; `machine` is every busy CPU, wrk "
                               "included):", {labels[k]: v for k, v in b1.get("cpu_ms_per_request", {}).items()})
    if b2 := sc.get("B2"):
        out += ["### B2 pipeline", "",
                f"{b2['messages']:,} messages (a third per lane) written by the bulk accept path; clock from its commit.", "",
                "| run | trivial tasks/s | SENT/s | READ/s | all SENT | all READ | sim sendText | sim CPU (of one core) |",
                "|---|---|---|---|---|---|---|---|"]
        for i, r in enumerate(b2["runs"]):
            out.append(f"| {i + 1} | {num(b2['baseline_tasks_per_s']['runs'][i])} | {num(r['sent_rate'])} | {num(r['read_rate'])} "
                       f"| {r['all_sent']} ({num(r['sent_s'], 1)} s) | {r['all_read']} ({num(r['read_s'], 1)} s) "
                       f"| {r['simulator_send_text']['total']:,} | {100 * r['simulator_cpu_share']:.0f} % |")
        first = b2["runs"][0]
        if first.get("cpu_ms_per_message"):
            out += [""] + _per_unit_table(
                "CPU milliseconds per unit of work in run 1 (all cores): one trivial task of the baseline against one "
                "message from its accept to READ (its send, its four events on both channels, the relay's share and "
                "the servers'). `machine` is every busy CPU, the load generator included.",
                {"per trivial task": first["cpu_ms_per_task"], "per message": first["cpu_ms_per_message"]})
        if alone := b2.get("sends_alone"):
            machine = alone["cpu_ms_per_message"].get("machine")
            emitted = alone["receipts_emitted"]
            out += [f"Sends alone, the send path's measured ceiling (one more run with the simulator's receipts off; "
                    f"not a figure of issue 7, whose pipeline includes them): SENT {num(alone['sent_rate'])}/s, "
                    f"{num(alone['ratio'], 2)}× the last baseline run, {num(machine, 1)} ms of machine CPU per message "
                    f"(receipts emitted meanwhile: {emitted['webhook']} webhooks, {emitted['rabbitmq']} RabbitMQ "
                    f"events).", ""]
        out += ["Peak RSS per process (sampled every 0.5 s during the first run): " +
                ", ".join(f"{k} {num(v)} MB" for k, v in b2["peak_rss_mb"].items()), ""]
    if b3 := sc.get("B3"):
        out += ["### B3 OTP latency behind a marketing backlog", "",
                f"{b3['otps']} OTPs at {num(b3['otp_rate'])}/s through the HTTP API (official instance), latency "
                f"accept → SENT; backlog {b3['backlog']:,} MARKETING from the bulk path. Typing delay off. Each stream "
                f"starts with {b3.get('warmup_otps', 0)} OTPs that are not measured (cold caches after the tables are "
                "emptied). Segments (p50 / p99): `relay` accept → released by the OTP relay; `pickup` the relay's pass, "
                "the broker and the lane worker up to its call to Evolution; `http` Evolution's (the simulator's) answer. "
                "Slowest: (position in the stream, ms).", "",
                "| run | | p50 / p99 | relay | pickup | http | slowest | backlog left |",
                "|---|---|---|---|---|---|---|---|"]

        def segment(r: dict[str, Any], name: str) -> str:
            part = r.get("segments", {}).get(name)
            return f"{num(part['p50_ms'])} / {num(part['p99_ms'])}" if part else "–"

        for i, (a, b) in enumerate(zip(b3["idle"]["runs"], b3["backlog_run"]["runs"])):
            for label, r in (("idle", a), ("with backlog", b)):
                out.append(f"| {i + 1} | {label} | {num(r['p50_ms'])} / {num(r['p99_ms'])} ms | {segment(r, 'relay')} | "
                           f"{segment(r, 'pickup')} | {segment(r, 'http')} | {r.get('slowest', '–')} | "
                           f"{num(r.get('backlog_left')) if label != 'idle' else ''} |")
        out.append("")
    if b4 := sc.get("B4"):
        out += ["### B4 gateway outage", "",
                f"{b4['messages']:,} UTILITY messages over {b4['instances']} instances; the simulator answers every sendText with "
                f"503 for {num(b4['outage_s'])} s, then recovers. Drained: {b4['drained']} in {num(b4['drain_s'], 1)} s; "
                f"final statuses {b4['final_statuses']}; attempts used in total {b4['attempts_total']:,}; pacing burst "
                f"{b4['pacing_burst']}.", "",
                "Gateway calls per second, all instances together (seconds since the outage began: calls/s): " +
                ", ".join(f"{t}s:{r:g}" for t, r in b4["calls_per_s_timeline"] if r) + "", ""]
    if b5 := sc.get("B5"):
        out += ["### B5 dual ingestion", "",
                "Events/s: unique events applied per second, from the first emit to the last status applied (the "
                "figure judged). With copies: until the slower channel's duplicate of every event was handled too. "
                "The baseline (the bare DRF insert under wrk, as in B1) is measured right before and right after "
                "each run, and the run is compared with their mean, so that the machine's drift does not enter the "
                "ratio. The load generator asks the "
                f"simulator for events in batches of {results['sizes'].get('b5_batch', 100)} once at most "
                f"{results['sizes'].get('b5_pending', 300)} webhooks are pending (the simulator holds the call "
                "until then: nothing polls).", "",
                "| run | bare insert req/s | events/s | with copies | inbox rows | processed | delivered | stray rows | webhooks posted | RabbitMQ published | counters | sim CPU |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for i, r in enumerate(b5["runs"]):
            counters = ", ".join(f"{k}={v}" for k, v in sorted(r["metrics"].items()))
            sides = r.get("baseline_before_after")
            bare_cell = num(r.get("baseline_rate")) + (f" ({num(sides[0])} before, {num(sides[1])} after)" if sides else "")
            out.append(f"| {i + 1} | {bare_cell} | {num(r['rate'])} | {num(r.get('rate_with_copies'))} | {r['inbox_rows']:,} | {r['inbox_processed']:,} | "
                       f"{r['messages_delivered']:,} | {r.get('stray_rows', 0)} | {r['webhooks_posted']:,} | {r['rabbitmq_published']:,} | {counters} "
                       f"| {100 * r['simulator_cpu_share']:.0f} % |")
        out.append("")
        first = b5["runs"][0]
        bare = first.get("cpu_ms_per_bare_insert") or (sc.get("B1") or {}).get("cpu_ms_per_request", {}).get("baseline")
        if first.get("cpu_ms_per_event"):
            rows = {"per event (both copies), run 1": first["cpu_ms_per_event"]}
            if bare:
                rows = {"per bare insert request, run 1": bare, **rows}
            out += _per_unit_table(
                "CPU milliseconds per unit of work (all cores): one event, both copies (the simulator's webhook and "
                "RabbitMQ publish, the webhook pool, the consumer, the servers) against one bare insert request. "
                "`machine` is every busy CPU, the load generator included.", rows)
    if b6 := sc.get("B6"):
        out += ["### B6 fairness in the marketing lane", "",
                f"A queues {b6['backlog']:,} MARKETING, B queues {b6['b_messages']} MARKETING "
                f"{num(results['sizes']['b6_delay_seconds'], 1)} s later (both bulk). Wait = sent_at − created_at.", "",
                "| run | B alone p50 / p99 | B behind A p50 / p99 | B sent | A sent meanwhile |", "|---|---|---|---|---|"]
        for i, (a, b) in enumerate(zip(b6["alone"]["runs"], b6["behind"]["runs"])):
            out.append(f"| {i + 1} | {num(a['p50_s'], 2)} / {num(a['p99_s'], 2)} s | {num(b['p50_s'], 2)} / {num(b['p99_s'], 2)} s "
                       f"| {b['sent']}/{b['count']} | {num(b.get('a_sent_meanwhile'))} |")
        out.append("")
    if b8 := sc.get("B8"):
        out += ["### B8 a slow gateway, typing on: the lane workers' pools side by side", "",
                f"{b8['messages']:,} UTILITY messages ({b8['text_chars']} characters: about "
                f"{b8['text_chars'] * int(b8['typing']['TYPING_DELAY_MS_PER_CHAR']) / 1000:.1f} s of typing) queued over "
                f"{b8['instances']} instances at the default pacing, an OTP stream of {num(b8['otp_rate'])}/s alongside, "
                f"each run {num(b8['window_s'])} s; throughput counted once the first sends could be back (latency + "
                "the longest typing + 1 s) to the end. The simulator answers sendText after the latency (`send_latency_ms`). "
                "On a shared machine these figures are noisy.", "",
                "| pool | latency | UTILITY sent/s | × caps | sendText in flight (max) | OTP p50 / p99 | peak RSS worker | "
                "peak DB connections (worker / all) |", "|---|---|---|---|---|---|---|---|"]
        for r in b8["runs"]:
            conns = r["peak_db_connections"]
            out.append(f"| {r['pool']} | {num(r['latency_s'], 1)} s | {num(r['throughput_per_s'], 1)} | {num(r['share_of_caps'], 2)} "
                       f"| {r['max_in_flight']} | {num(r['otp_p50_ms'])} / {num(r['otp_p99_ms'])} ms "
                       f"| {num(r['peak_rss_mb'].get('worker'))} MB | {conns.get('worker', 0)} / {sum(conns.values())} |")
        out.append("")
    cpu_lines = [_cpu(name, s["cpu"]) for name, s in sc.items() if s.get("cpu")]
    if cpu_lines:
        out += ["### Where the CPU went (share of the machine: cores × wall time)", "", *cpu_lines, "",
                "The simulator's share is its own CPU; it stays far from a full core, so it is not the bottleneck.", ""]
    return out


def _profiles(results: dict[str, Any]) -> list[str]:
    profiles = results.get("profiles")
    if not profiles:
        return []
    out = ["## Profiles (py-spy, raw stacks in artifacts/bench/profiles/)", ""]
    if "error" in profiles:
        return out + [profiles["error"], ""]
    for name, p in profiles.items():
        out += [f"### {name}: {p['samples']:,} samples", "", "| own time | % | | project code, inclusive | % |", "|---|---|---|---|---|"]
        own, mine = p["own"][:10], p["project_inclusive"][:10]
        for i in range(max(len(own), len(mine))):
            a = own[i] if i < len(own) else ("", "")
            b = mine[i] if i < len(mine) else ("", "")
            out.append(f"| `{a[0]}` | {a[1]} | | `{b[0]}` | {b[1]} |")
        out.append("")
    return out


def _lane_pool_text(stack: dict[str, Any]) -> str:
    concurrency = stack.get("worker_concurrency")
    if isinstance(concurrency, dict):  # since issue 26: per lane, threads pool by default
        return f"{stack.get('worker_pool', 'threads')} pool, " + ", ".join(f"{lane} -c {n}" for lane, n in concurrency.items())
    return f"prefork -c {concurrency}"


def _priorities_text(priorities: dict[str, int] | None) -> str:
    if priorities is None:
        return "not recorded"
    lowered = sorted(name for name, nice in priorities.items() if nice)
    if not lowered:
        return "every process at normal priority"
    levels = sorted({priorities[name] for name in lowered})
    return (f"{', '.join(lowered)} at nice {'/'.join(map(str, levels))} (their sessions too); "
            "web, relay-otp, worker-otp, the simulator and the servers at normal priority")


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m bench`; sizes in bench/sizes.py, override with `--set name=value` or "
        "`BENCH_<NAME>`). Every figure is measured against its baseline in the same run, on the real stack: gunicorn "
        f"for the client API ({results['stack']['web_workers']} workers{', ' + results['stack'].get('web_args') if results['stack'].get('web_args') else ', sync'}) and "
        f"another for Evolution's webhooks ({results['stack'].get('webhook_args') or 'as in the Procfile'}), one Celery worker per lane ("
        f"{_lane_pool_text(results['stack'])}), relay, RabbitMQ consumer, Postgres, Redis, RabbitMQ and the "
        "Evolution simulator, all on this one machine together with the load generator. Priorities as in the Procfile: "
        + _priorities_text(results["stack"].get("priorities")) + ".",
        "",
        f"- Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, Python {m['python']}",
        f"- Date: {m['date']}; commit `{m['commit']}`{' (with uncommitted changes)' if m['dirty'] else ''}",
        f"- Load average before / after: {m['load_before']} / {m.get('load_after')}; total run {num(results.get('elapsed_s'))} s",
        f"- Runs per figure: {results['sizes']['runs']} (B1: {results['sizes'].get('b1_runs', results['sizes']['runs'])}, "
        f"B2: {results['sizes']['b2_runs']}, B5: "
        f"{results['sizes']['b5_runs']}, B4: 1); figures are the median with (min–max).",
    ]
    for name, seen in results.get("disturbed", {}).items():
        lines.append(f"- {name} was disturbed: the database dropped connections {len(seen)}× during it "
                     f"(first: `{seen[0]}`); its figures include that recovery")
    for name, when in results.get("kept", {}).items():
        lines.append(f"- {name}: figures from the previous run ({when}), kept with `--keep`")
    for item in results.get("revived", []):
        lines.append(f"- A stack process had died and was restarted: {item}")
    for name, error in results.get("retried", {}).items():
        lines.append(f"- {name} was retried once after: `{error[:160]}`")
    if results.get("smoke"):
        lines += ["", "**Smoke run (tiny sizes): these numbers only prove the harness works; they measure nothing.**"]
    lines += ["", "## Summary", "", *_summary(results), "", "## Details", "", *_details(results), *_profiles(results)]
    if FINDINGS.exists():
        lines += [FINDINGS.read_text().rstrip(), ""]
    return "\n".join(lines) + "\n"
