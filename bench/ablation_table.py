"""The ablation's figures, verdicts and table (`python -m bench --ablation`, issue 25): each variant's rounds
summarised as medians with min–max, each device's verdict against "all on" under issue 25 §2's rule, and the
Markdown table that docs/benchmarks.md shows. Pure functions of the results JSON (bench/ablation.py runs them).
"""

from __future__ import annotations

import math
from typing import Any

from .stats import Spread

REFERENCE = "all-on"  # the variant every change is measured against: today's product, every device on
# What scripts/launch.sh --describe says where it can make no systemd scope (LAUNCH_SLICES then changes nothing).
NO_SLICES = "no systemd slices on this host"
PLACEBO = "placebo"  # today's product again under a switch nothing reads: the host's noise between slots

FIGURES = (
    ("b1_ratio", "B1 ratio", ("b1", "ratio"), +1, 2),
    ("b1_p99_ratio", "B1 p99 ratio", ("b1", "p99_ratio"), -1, 2),
    ("b1_cpu_ratio", "B1 CPU ratio", ("b1", "cpu_ratio"), -1, 2),
    ("b3_ratio", "B3 ratio", ("b3", "ratio"), -1, 2),
    ("b5_ratio", "B5 ratio", ("b5", "ratio"), +1, 2),
    ("b2_cpu_ms", "B2 CPU ms/msg", ("b2", "cpu_ms_per_message", "stack"), -1, 1),
)
# Shown, not judged (issue 25 §3's question, whether an OTP stream halves everyone else's sends, is read
# across the rows).
EXTRA = (
    ("b2_sent_rate", ("b2", "sent_rate")),
    ("b2_sent_rate_with_otps", ("b2", "with_otps", "sent_rate")),
    ("b2_with_otps_ratio", ("b2", "with_otps_ratio")),
    ("b2_otp_p99_ms", ("b2", "with_otps", "otp_p99_ms")),
    ("b2_machine_cpu_ms", ("b2", "cpu_ms_per_message", "machine")),
    ("b1_funnel_p99_ms", ("b1", "funnel", "p99_ms")),
    ("b1_baseline_p99_ms", ("b1", "baseline", "p99_ms")),
    ("b3_busy_p99_ms", ("b3", "busy_p99_ms")),
    ("b3_idle_p99_ms", ("b3", "idle_p99_ms")),
)
FLOORS = {"B1": "≥ 0.7× with p99 ≤ 1.5× the bare insert's", "B3": "≤ 1.5×", "B5": "≥ 0.5×"}
MISSING = {"median": math.nan, "min": math.nan, "max": math.nan, "runs": []}  # a figure an older run did not record
FLOOR_FIGURES = {"B1": ("b1_ratio", "b1_p99_ratio"), "B3": ("b3_ratio",), "B5": ("b5_ratio",)}
COST = 0.05  # a device that costs more than this share of a figure when off earns its place
# Switches the kept tables (bench/results/) name that the product no longer reads: each device bought more than
# issue 46's 15 % there, so it is the only path and has no switch (bench/findings.md, "One path per job").
# Switch → the device it turned off.
REMOVED = {
    "ACCEPT_REMEMBER_ROUTING": "remembered routing guards",
    "ACCEPT_ONE_STATEMENT": "one-statement accept",
    "DATABASE_PREPARED_STATEMENTS": "prepared statements",
    "SEND_PLAIN_VALIDATOR": "second validator",
}
# Switches the kept tables name whose device went with them: the per-number sending policy is the one place that
# decides when a number may send, and these were flow control beside it (bench/findings.md, "Flow control").
GONE_WITH_DEVICE = {
    "GATEWAY_ADAPTIVE_LIMIT": "adaptive gateway limit",
}


def _dig(slot: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = slot
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return math.nan
        value = value[part]
    return float(value) if isinstance(value, (int, float)) and value is not None else math.nan


def summarize(slots: list[dict[str, Any]]) -> dict[str, Any]:
    """Median (min–max) of each figure over a variant's rounds, and whether every run was complete."""
    figures = {key: Spread.of([_dig(s, path) for s in slots]).as_dict() for key, _, path, _, _ in FIGURES}
    figures.update({key: Spread.of([_dig(s, path) for s in slots]).as_dict() for key, path in EXTRA})
    complete = all("error" not in s and s["b1"]["every_202_stored"] and s["b5"]["correct"] and s["b3"]["all_sent"]
                   and s["b2"]["all_read"] and s["b2"]["with_otps"]["all_read"] for s in slots)
    return {"figures": figures, "rounds": len(slots), "complete": bool(slots) and complete,
            "errors": sum("error" in s for s in slots)}


def met(figures: dict[str, Any]) -> dict[str, bool]:
    m = {key: figures[key]["median"] for key in ("b1_ratio", "b1_p99_ratio", "b3_ratio", "b5_ratio")}
    return {"B1": m["b1_ratio"] >= 0.7 and m["b1_p99_ratio"] <= 1.5, "B3": m["b3_ratio"] <= 1.5, "B5": m["b5_ratio"] >= 0.5}


def change(value: float, reference: float) -> float:
    return (value - reference) / reference if reference and not math.isnan(reference) else math.nan


def paired_changes(figure: dict[str, Any], reference: dict[str, Any]) -> list[float]:
    """The change of each round against all on in the same round (the rounds are interleaved, so a pair
    shares the host's phase more closely than the medians do)."""
    pairs = zip(figure.get("runs") or [], reference.get("runs") or [])
    return [c for c in (change(v, r) for v, r in pairs) if not math.isnan(c)]


def shown(figure: dict[str, Any], reference: dict[str, Any], better: int,
          placebo: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Whether switching the device off made this figure worse beyond the host's noise: in every round
    against all on in the same round (with at least two rounds), or with the two ranges apart; and, when the
    run has a placebo, by more than the placebo moved from all on (identical code, other slots). A change
    that the noise could make, however large its median, shows nothing."""
    pairs = paired_changes(figure, reference)
    worse = sum(-better * c > 0 for c in pairs)
    apart = figure["min"] > reference["max"] or reference["min"] > figure["max"]
    consistent = len(pairs) >= 2 and worse == len(pairs)
    how = f"worse in {worse} of {len(pairs)} rounds" + ("" if not apart else ", ranges apart")
    if placebo is None or math.isnan(placebo["median"]):
        return consistent or apart, how
    noise = abs(change(placebo["median"], reference["median"]))
    beyond = abs(change(figure["median"], reference["median"])) > noise
    return (consistent or apart) and beyond, how + f"; the placebo moved {100 * noise:.0f} %"


def verdict(figures: dict[str, Any], reference: dict[str, Any],
            placebo: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    """Issue 25 §2: a device earns its place when switching it off pushes a target that all-on meets below its
    floor, or costs more than 5 % of a figure, and the change is shown beyond noise (`shown`). The reasons say
    which; a change the noise could make is listed with "noise" and counts for nothing."""
    reasons: list[str] = []
    counted = False
    clear: dict[str, bool] = {}
    for key, column, _, better, _ in FIGURES:
        figure, base = figures.get(key, MISSING), reference.get(key, MISSING)
        moved = change(figure["median"], base["median"])
        if math.isnan(moved) or -better * moved <= COST:
            continue
        clear[key], how = shown(figure, base, better, None if placebo is None else placebo.get(key, MISSING))
        counted |= clear[key]
        reasons.append(f"{column} {percent(moved)} ({how}{'' if clear[key] else ': noise'})")
    before, after = met(reference), met(figures)
    for target in FLOORS:
        if before[target] and not after[target]:
            real = any(clear.get(key, False) for key in FLOOR_FIGURES[target])
            counted |= real
            reasons.insert(0, f"{target} falls below {FLOORS[target]}" + ("" if real else " (noise)"))
    return ("earns its place" if counted else "removable"), reasons


def percent(share: float) -> str:
    return "n/a" if math.isnan(share) else f"{100 * share:+.0f} %"


def _num(value: float, digits: int) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def _ratio_text(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}×"


def _cell(figure: dict[str, Any], reference: dict[str, Any] | None, digits: int) -> str:
    text = _num(figure["median"], digits)
    if math.isnan(figure["median"]):
        return text
    if figure["min"] != figure["max"] and not math.isnan(figure["min"]):
        text += f" ({_num(figure['min'], digits)}–{_num(figure['max'], digits)})"
    if reference is not None:
        moved = change(figure["median"], reference["median"])
        text += f" {percent(moved)}"
    return text


def render(results: dict[str, Any]) -> list[str]:
    """The ablation table (Markdown lines): rows = variants, each figure's median (min–max) and change vs all on."""
    variants = results["variants"]
    summaries = results.get("summary", {})
    reference = summaries.get(REFERENCE, {}).get("figures")
    placebo = summaries.get(PLACEBO, {}).get("figures") if summaries.get(PLACEBO, {}).get("rounds") else None
    sizes = results["sizes"]
    m = results.get("machine", {})
    lines = [
        f"Ablation: each device switched off alone (`python -m bench --ablation`), {sizes['rounds']} round(s) round-robin "
        f"over {len(variants)} variants, each variant a stack of its own; median (min–max) of the rounds, then the "
        f"change against all on. Commit `{m.get('commit', '?')}`, {m.get('date', '?')}, {m.get('cores', '?')} cores, load "
        f"before / after {m.get('load_before', '?')} / {m.get('load_after', '?')}; total {_num(results.get('elapsed_s', math.nan), 0)} s."
        + (" **Smoke run: tiny sizes, the figures mean nothing.**" if results.get("smoke") else ""),
        "",
        f"Per variant and round: B1 one {sizes['b1_seconds']:g}-s wrk run each of the bare DRF insert and the funnel "
        f"({sizes['b1_connections']} connections; p99 ratio = the funnel's p99 over the bare insert's; CPU ratio = the stack's and its servers' CPU per accepted request over per bare insert, the figure that bounds B1's rate on a CPU-bound machine and moves least with the host's load); B5 {sizes['b5_events']:,} "
        f"events against the bare insert before and after; B3 {sizes['b3_otps']} OTPs at {sizes['b3_otp_rate']:g}/s idle, then "
        f"behind {sizes['b3_backlog']:,} marketing (p99 ratio); B2 {sizes['b2_messages']:,} messages to READ: CPU ms per "
        f"message of the stack's processes and its own servers, and SENT/s with another tenant's OTPs at "
        f"{sizes['b2_otp_rate']:g}/s alongside (× the same run without). Targets: B1 {FLOORS['B1']}, B3 {FLOORS['B3']}, "
        f"B5 {FLOORS['B5']}; a device earns its place when switching it off breaks a target all on meets, or costs more "
        f"than {100 * COST:.0f} % of a figure, beyond the host's noise: worse in every round than all on in the same "
        f"round, or the two ranges apart" + (", and by more than the placebo (today's product under a switch no code "
        "reads, in slots of its own) moved from all on" if placebo else "") + ". A larger change the noise could make "
        f"is marked \"noise\" and counts for nothing. B2 SENT/s with OTPs is shown, not judged." + (
            f" The simulator ran at nice {sizes['gateway_nice']} throughout (a gateway with CPU of its own, as B8's)."
            if sizes.get("gateway_nice") else ""),
        "",
        "| device off | switch | B1 ratio | B1 p99 ratio | B1 CPU ratio | B3 ratio | B5 ratio | B2 CPU ms/msg "
        "| B2 SENT/s with OTPs | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, info in variants.items():
        summary = summaries.get(key)
        switch = " ".join(f"`{k}={v}`" for k, v in info["env"].items()) or "–"
        if not summary or not summary["rounds"] or summary["errors"] == summary["rounds"]:
            lines.append(f"| {info['device']} | {switch} | " + " | ".join(["–"] * (len(FIGURES) + 1)) + " | not measured |")
            continue
        figures = summary["figures"]
        is_reference = key == REFERENCE
        cells = [_cell(figures.get(k, MISSING), None if is_reference or reference is None else reference.get(k, MISSING), digits)
                 for k, _, _, _, digits in FIGURES]
        with_otps = (f"{_num(figures['b2_sent_rate_with_otps']['median'], 0)} "
                     f"({_ratio_text(figures['b2_with_otps_ratio']['median'])} alone)")
        if is_reference:
            judged = "reference; targets met: " + (", ".join(t for t, ok in met(figures).items() if ok) or "none")
        elif key == PLACEBO:
            judged = "the host's noise: today's product in other slots"
        elif not info["read_by_product"]:
            judged = "switch not read by this commit: noise"
        elif "LAUNCH_SLICES" in info["env"] and NO_SLICES in str(results.get("machine", {}).get("launcher", "")):
            judged = "no systemd slices on this host, so the switch changed nothing here: noise"
        elif reference is None:
            judged = "no reference"
        else:
            word, reasons = verdict(figures, reference, placebo)
            judged = f"**{word}**" + (f" ({'; '.join(reasons)})" if reasons else "")
        if not summary["complete"]:
            judged += "; incomplete run(s)"
        lines.append(f"| {info['device']} | {switch} | " + " | ".join(cells) + f" | {with_otps} | {judged} |")
    return lines


def removed_note(switches: list[str]) -> list[str]:
    """The lines under the device tables that say which of the switches they name are gone, the device kept."""
    lines: list[str] = []
    gone = [name for name in dict.fromkeys(switches) if name in REMOVED]
    if gone:
        named = ", ".join(f"`{name}` ({REMOVED[name]})" for name in gone)
        lines += [f"Removed after these runs: {named}. Each of these devices bought more than 15 % of its figure "
                  "above (issue 46's rule), so it stays as the product's only path: its switch was deleted with the "
                  "plain path it chose, and its rows here are the record (bench/findings.md, \"One path per job\").",
                  ""]
    with_device = [name for name in dict.fromkeys(switches) if name in GONE_WITH_DEVICE]
    if with_device:
        named = ", ".join(f"`{name}` ({GONE_WITH_DEVICE[name]})" for name in with_device)
        lines += [f"Removed with its device after these runs: {named}. Its row was measured before the per-number "
                  "sending policy existed; the policy is now the one place that decides when a number may send, "
                  "and the device went unmeasured beside it (bench/findings.md, \"The bulk lanes' turns (adaptive gateway limit): removed\").", ""]
    return lines
