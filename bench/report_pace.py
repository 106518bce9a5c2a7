"""The report's rows for B9, unofficial numbers at a compressed human pace (bench/scenarios/b9_human_pace.py)."""

from __future__ import annotations

from typing import Any

from .report_format import num, per_unit_table, status


def _row_b9(b9: dict[str, Any]) -> list[str]:
    r, late = b9["rate_ratio"], b9["lateness_ms"]
    full_speed = f"{num(b9['b2_stack_ms_per_message'], 1)} ms per message"
    if b9.get("cpu_judged_at") == "same_rate":
        same = b9["b2_at_rate"]
        baseline = (f"B2's pipeline fed at B9's rate ({num(same['sends_per_s'], 1)}/s): "
                    f"{num(same['stack_ms_per_message'], 1)} ms per message; at full speed, before and after: {full_speed}")
        ratio = f"CPU {num(b9['same_rate_cpu_ratio'], 2)}× (B2 at full speed: {num(b9['cpu_ratio'], 2)}×)"
        cpu_target = "CPU ≤ 1.25× B2's pipeline at the same rate"
    else:  # a run from before B9 fed B2's pipeline at its rate judged it against B2 at full speed
        baseline, ratio, cpu_target = f"B2's pipeline, before and after: {full_speed}", f"CPU {num(b9['cpu_ratio'], 2)}×", "CPU ≤ 1.25×"
    return [f"| B9 | {b9['numbers']:,} unofficial numbers at {num(b9['sends_per_s'], 1)} sends/s (policy time ×"
            f"{num(b9['time_scale'], 0)}): each number's rate of its policy's min {num(r['min'], 3)} (p1 "
            f"{num(r['p1'], 3)}, p50 {num(r['p50'], 3)}); timer lateness p50 {num(late['p50'])} ms, p99 "
            f"{num(late['p99'])} ms, max {num(late['max'])} ms; {num(b9['stack_ms_per_message'], 1)} ms of stack CPU "
            f"per message | {baseline} | {ratio} | rate ≥ 0.9× each number; lateness p99 ≤ 1,000 ms; {cpu_target} "
            f"| {status(b9['met'])} (rate {_yes(b9['rate_met'])}, lateness {_yes(b9['lateness_met'])}, "
            f"CPU {_yes(b9['cpu_met'])}) |"]


def _yes(met: bool) -> str:
    return "met" if met else "not met"


def _appendix_b9(b9: dict[str, Any], results: dict[str, Any]) -> list[str]:
    gap, real = b9["gap_policy_s"], b9["gap_real_s"]
    out = [f"{b9['numbers']:,} numbers of project H on the `unofficial` profile, connected, each with a backlog of "
           f"{b9['backlog_per_number']} UTILITY messages ({b9['messages']:,} in all, written in "
           f"{num(b9['accept_s'], 1)} s) to {b9['recipients']} recipients it exchanged with before (warm: the "
           "cold-contact quota and the sticky sender decide nothing). The relays and lane workers ran with "
           f"`SENDING_POLICY_TIME_SCALE` = {num(b9['time_scale'], 0)}, each number's gap {num(gap[0])}–{num(gap[1])} "
           f"policy s ({num(real[0], 1)}–{num(real[1], 1)} s real), the caps at their defaults; typing off, as in "
           "B2. Each number's first slot was spread over one gap. What the policy allowed is every value the product "
           "wrote to its schedule's `next_send_at`, kept with its time by a trigger in the bench database during the "
           "run; a send's time is its receipt at the simulator.", "",
           "| figure | value |", "|---|---|",
           f"| sends in the {num(b9['window_s'])} s window | {b9['sent_in_window']:,} ({num(b9['sends_per_s'], 1)}/s; "
           f"the gaps' mean allows {num(b9['expected_sends_per_s'], 1)}/s) |",
           f"| rate of the policy's, per number: min / p1 / p50 | {num(b9['rate_ratio']['min'], 3)} / "
           f"{num(b9['rate_ratio']['p1'], 3)} / {num(b9['rate_ratio']['p50'], 3)} |",
           f"| numbers under 0.9× / with fewer than two sends in the window | {b9['below_target']} / "
           f"{b9['without_two_sends']} |",
           f"| slots judged / never sent | {b9['slots']:,} / {b9['unsent_slots']} |",
           f"| timer lateness min / p50 / p99 / max | {num(b9['lateness_ms']['min'])} / {num(b9['lateness_ms']['p50'])}"
           f" / {num(b9['lateness_ms']['p99'])} / {num(b9['lateness_ms']['max'])} ms |",
           f"| held for another reason than `pacing` | {_holds(b9['other_holds'])} |",
           f"| stack CPU per message (servers in, simulator out) | {num(b9['stack_ms_per_message'], 2)} ms; B2 before "
           f"{num(b9['b2_before']['stack_ms_per_message'], 2)}, after {num(b9['b2_after']['stack_ms_per_message'], 2)}"
           f" ms: {num(b9['cpu_ratio'], 2)}× |",
           *_at_rate_line(b9),
           f"| of which the idle stack (its CPU with nothing to send, at the window's rate) | "
           f"{num(b9.get('idle_ms_per_message'), 2)} ms ({num(b9.get('idle_stack_ms_per_s'))} ms of CPU per second) |",
           ""]
    if worst := b9.get("latest_slots"):
        out += ["The latest slots (seconds into the window; from the slot to the relay's release, then to the "
                "gateway's receipt):", "", "| number | slot at | late | to release | release to gateway |",
                "|---|---|---|---|---|"]
        out += [f"| {w['number']} | {num(w['slot_s'], 1)} s | {num(w['late_ms'])} ms | {num(w['to_release_ms'])} ms "
                f"| {num(w['release_to_gateway_ms'])} ms |" for w in worst]
        out.append("")
    if b9.get("slowest"):
        out += ["Slowest numbers (rate of the policy's): "
                + ", ".join(f"{name} {num(v, 3)}" for name, v in b9["slowest"].items()) + ".", ""]
    rows = {"B9, per message SENT in the window": b9["cpu_ms_per_message"],
            "B2 before, per message": b9["b2_before"]["cpu_ms_per_message"]}
    if same := b9.get("b2_at_rate"):
        rows["B2 fed at B9's rate, per message SENT in its window"] = same["cpu_ms_per_message"]
    return out + per_unit_table(
        "CPU milliseconds per message by process kind: B9's window against B2's pipeline (accept to READ) before it"
        + (", and against B2's pipeline fed at B9's rate." if same else "."), rows)


def _at_rate_line(b9: dict[str, Any]) -> list[str]:
    """B2's pipeline with a backlog like B9's, each message due at a moment of its own at B9's rate, on official numbers
    (no human pace): what a message costs at that rate without the policy."""
    same = b9.get("b2_at_rate")
    if not same:
        return []
    return [f"| B2's pipeline fed at B9's rate: the same backlog's shape, each message due at a moment of its own, on "
            f"A's official numbers (no human pace) | {same['sent_in_window']:,} SENT in {num(same['window_s'])} s "
            f"({num(same['sends_per_s'], 1)}/s), {num(same['stack_ms_per_message'], 2)} ms of stack CPU per message: "
            f"B9 {num(b9['same_rate_cpu_ratio'], 2)}× it |"]


def _holds(holds: dict[str, int]) -> str:
    return ", ".join(f"{why} {n}" for why, n in sorted(holds.items())) or "none"
