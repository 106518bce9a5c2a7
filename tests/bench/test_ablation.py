"""`python -m bench --ablation` (bench/ablation.py, bench/ablation_table.py): the verdict rule and the table on given figures, the
variants' order, which servers are ours, and the whole harness end to end at smoke sizes.

The end-to-end test asserts no speed (benchmarks measure, tests do not time): it checks that every variant
ran every figure in its own stack and that the table was written.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import ablation, ablation_measure, ablation_table
from bench.ablation import VARIANTS, rounds_order, select
from bench.ablation_table import REFERENCE, render, verdict

ROOT = Path(__file__).resolve().parents[2]

# Today's figures, every target met: B1 0.8× with p99 1.3× (1.4× the bare insert's CPU per request), B3 1.3×, B5 0.6×, 20 ms of CPU per message.
TODAY = {"b1_ratio": 0.8, "b1_p99_ratio": 1.3, "b1_cpu_ratio": 1.4, "b3_ratio": 1.3, "b5_ratio": 0.6, "b2_cpu_ms": 20.0}


def _figures(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """A variant's summary figures as bench.ablation_table.summarize shapes them, from each round's values."""
    keys = {*TODAY, *(key for key, _ in ablation_table.EXTRA)}
    figures = {}
    for key in keys:
        values = [r.get(key, math.nan) for r in rounds]
        clean = sorted(v for v in values if not math.isnan(v))
        median = clean[len(clean) // 2] if clean else math.nan
        figures[key] = {"median": median, "min": min(clean, default=math.nan), "max": max(clean, default=math.nan),
                        "runs": values}
    return figures


def _same(**changed: float) -> dict[str, float]:
    return {**TODAY, **changed}


def test_a_device_whose_absence_breaks_a_met_target_in_every_round_earns_its_place() -> None:
    # given: B3 at 1.3x with the device, 1.8x and 1.7x without (above the 1.5x floor), round by round
    reference = _figures([TODAY, TODAY])
    off = _figures([_same(b3_ratio=1.8), _same(b3_ratio=1.7)])

    # when
    word, reasons = verdict(off, reference)

    # then
    assert word == "earns its place"
    assert reasons == ["B3 falls below ≤ 1.5×", "B3 ratio +38 % (worse in 2 of 2 rounds, ranges apart)"]


def test_a_device_that_costs_more_than_5_percent_of_a_figure_in_every_round_earns_its_place_though_every_target_holds() -> None:
    reference = _figures([TODAY, _same(b2_cpu_ms=21.0)])
    off = _figures([_same(b2_cpu_ms=23.0), _same(b2_cpu_ms=22.5)])  # median 23 against 21: +10 %

    word, reasons = verdict(off, reference)

    assert word == "earns its place"
    assert reasons == ["B2 CPU ms/msg +10 % (worse in 2 of 2 rounds, ranges apart)"]


def test_a_device_whose_absence_changes_every_figure_by_5_percent_or_less_is_removable() -> None:
    reference = _figures([TODAY])
    # Better or at most 5 % worse everywhere: B1 a little lower, its p99 and B3 a little higher, less CPU.
    off = _figures([_same(b1_ratio=0.77, b1_p99_ratio=1.36, b3_ratio=1.36, b5_ratio=0.7, b2_cpu_ms=15.0)])

    assert verdict(off, reference) == ("removable", [])


def test_a_p99_above_one_and_a_half_times_the_bare_inserts_breaks_b1_even_at_a_good_accept_rate() -> None:
    reference = _figures([TODAY, TODAY])
    off = _figures([_same(b1_ratio=0.9, b1_p99_ratio=1.6), _same(b1_ratio=0.85, b1_p99_ratio=1.7)])

    word, reasons = verdict(off, reference)

    assert word == "earns its place"
    assert reasons[0] == "B1 falls below ≥ 0.7× with p99 ≤ 1.5× the bare insert's"


def test_a_large_change_that_the_rounds_do_not_agree_on_is_noise_and_counts_for_nothing() -> None:
    # given: B3 all on reads 1.3x, 0.6x, 1.6x, 1.0x round by round (the host's noise); off reads 3.0x in one
    # round and better in two: its median is far worse and even crosses the floor, but two rounds say better
    reference = _figures([TODAY, _same(b3_ratio=0.6), _same(b3_ratio=1.6), _same(b3_ratio=1.0)])
    off = _figures([_same(b3_ratio=3.0), _same(b3_ratio=0.5), _same(b3_ratio=1.7), _same(b3_ratio=0.9)])

    word, reasons = verdict(off, reference)

    assert word == "removable"
    assert reasons == ["B3 falls below ≤ 1.5× (noise)", "B3 ratio +31 % (worse in 2 of 4 rounds: noise)"]


def test_a_change_every_round_agrees_on_counts_even_when_the_ranges_overlap() -> None:
    # given: B1 varies from 0.6x to 0.9x with the host, but each round off is lower than all on in the same round
    reference = _figures([_same(b1_ratio=0.9), _same(b1_ratio=0.6), _same(b1_ratio=0.8)])
    off = _figures([_same(b1_ratio=0.8), _same(b1_ratio=0.55), _same(b1_ratio=0.7)])  # median 0.7 against 0.8

    word, reasons = verdict(off, reference)

    assert word == "earns its place"
    assert reasons == ["B1 ratio -13 % (worse in 3 of 3 rounds)"]


def test_one_round_alone_shows_nothing_unless_its_value_is_outside_the_reference_range() -> None:
    reference = _figures([TODAY])
    off = _figures([_same(b5_ratio=0.5)])  # -17 % in its single round: one pair is no evidence, but apart

    assert verdict(off, reference) == ("earns its place", ["B5 ratio -17 % (worse in 1 of 1 rounds, ranges apart)"])
    assert ablation_table.shown(_figures([_same(b5_ratio=0.5)])["b5_ratio"],
                          _figures([_same(b5_ratio=0.6)])["b5_ratio"], +1) == (True, "worse in 1 of 1 rounds, ranges apart")


def _results(read: bool = True) -> dict[str, Any]:
    variants = {v.key: {"device": v.device, "env": v.env, "read_by_product": read or not v.env}
                for v in VARIANTS if v.key in (REFERENCE, "ack-batch", "priorities")}
    summary = {
        REFERENCE: {"figures": _figures([TODAY, TODAY]), "rounds": 2, "complete": True, "errors": 0},
        "ack-batch": {"figures": _figures([_same(b3_ratio=2.0), _same(b3_ratio=2.2)]), "rounds": 2, "complete": True,
                       "errors": 0},
        "priorities": {"figures": _figures([TODAY, TODAY]), "rounds": 2, "complete": False, "errors": 0},
    }
    sizes = {**ablation.asdict(ablation.AblationSizes())}
    return {"variants": variants, "summary": summary, "sizes": sizes, "machine": {"commit": "abc1234"},
            "smoke": False, "elapsed_s": 1500.0}


def test_a_change_no_larger_than_the_placebos_is_the_hosts_noise_however_every_round_agrees() -> None:
    # given: B1's CPU ratio at 1.4x all on; the batched ACKs off (not on B1's path) read 1.9x and 2.0x, worse in
    # both rounds, ranges apart: and today's product under a switch nothing reads read 1.9x and 1.8x in its slots
    reference = _figures([TODAY, TODAY])
    off = _figures([_same(b1_cpu_ratio=1.9), _same(b1_cpu_ratio=2.0)])
    placebo = _figures([_same(b1_cpu_ratio=1.9), _same(b1_cpu_ratio=1.8)])

    # when
    word, reasons = verdict(off, reference, placebo)

    # then: the median off (2.0x, as _figures takes it) is +43 % over all on, the placebo's (1.9x) +36 %: beyond it
    assert word == "earns its place" and "the placebo moved 36 %" in reasons[0]
    # but a device that moved no more than the placebo shows nothing
    word, reasons = verdict(_figures([_same(b1_cpu_ratio=1.8), _same(b1_cpu_ratio=1.9)]), reference, placebo)
    assert word == "removable" and reasons == ["B1 CPU ratio +36 % (worse in 2 of 2 rounds, ranges apart; "
                                               "the placebo moved 36 %: noise)"]


def test_the_placebo_is_a_variant_whose_switch_no_code_reads_and_its_row_is_the_noise() -> None:
    placebo = next(v for v in VARIANTS if v.key == ablation_table.PLACEBO)
    assert all(not ablation.read_by_product(name) for name in placebo.env)

    results = _results()
    results["variants"][ablation_table.PLACEBO] = {"device": placebo.device, "env": placebo.env, "read_by_product": False}
    results["summary"][ablation_table.PLACEBO] = {"figures": _figures([TODAY, TODAY]), "rounds": 2, "complete": True,
                                                  "errors": 0}
    lines = render(results)

    row = next(line for line in lines if line.startswith("| nothing (placebo)"))
    assert row.endswith("| the host's noise: today's product in other slots |")
    assert any("by more than the placebo" in line for line in lines)


def test_the_table_has_one_row_per_variant_with_each_figure_its_change_and_a_verdict() -> None:
    lines = render(_results())

    header = next(line for line in lines if line.startswith("| device off"))
    assert header == ("| device off | switch | B1 ratio | B1 p99 ratio | B1 CPU ratio | B3 ratio | B5 ratio "
                      "| B2 CPU ms/msg | B2 SENT/s with OTPs | verdict |")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ") and "---" not in line}
    assert rows["all on (today)"].startswith("| all on (today) | – | 0.80 | 1.30 | 1.40 | 1.30 | 0.60 | 20.0 |")
    assert "reference; targets met: B1, B3, B5" in rows["all on (today)"]
    window = rows["batched consumer ACKs"]
    assert "| `CONSUMER_ACK_BATCH=1` |" in window
    assert "| 2.20 (2.00–2.20) +69 % |" in window  # B3: median of the rounds (min–max), change vs all on
    assert "| 0.80 +0 % |" in window
    assert "**earns its place** (B3 falls below ≤ 1.5×; B3 ratio +69 % (worse in 2 of 2 rounds, ranges apart))" in window
    assert "**removable**; incomplete run(s)" in rows["process priorities"]
    assert all(row.count(" | ") == 9 for row in rows.values())


def test_a_run_from_before_a_figure_existed_renders_it_as_n_a() -> None:
    results = _results()
    for summary in results["summary"].values():
        del summary["figures"]["b1_cpu_ratio"]

    rows = [line for line in render(results) if line.startswith("| batched consumer ACKs")]

    assert rows[0].split(" | ")[4] == "n/a"


def test_a_switch_the_product_does_not_read_gets_no_verdict() -> None:
    lines = render(_results(read=False))

    window = next(line for line in lines if line.startswith("| batched consumer ACKs"))
    assert window.endswith("| switch not read by this commit: noise |")


def test_the_variants_are_all_on_first_then_the_chosen_ones_and_each_round_starts_one_later() -> None:
    chosen = select("ack-batch,priorities")
    assert [v.key for v in chosen] == [REFERENCE, "ack-batch", "priorities"]
    assert [v.key for v in select("")] == [v.key for v in VARIANTS]
    with pytest.raises(SystemExit, match="unknown nope"):
        select("nope")

    order = [(r, v.key) for r, v in rounds_order(chosen, 3)]

    assert order == [(1, REFERENCE), (1, "ack-batch"), (1, "priorities"),
                     (2, "ack-batch"), (2, "priorities"), (2, REFERENCE),
                     (3, "priorities"), (3, REFERENCE), (3, "ack-batch")]


def test_sizes_come_from_env_and_the_command_line_which_wins() -> None:
    sizes = ablation.resolve_sizes(False, ["b2_messages=900"], env={"BENCH_ABLATION_B2_MESSAGES": "700",
                                                                     "BENCH_ABLATION_ROUNDS": "3"})
    assert (sizes.b2_messages, sizes.rounds) == (900, 3)
    assert sizes.scenario_sizes().b2_messages == 900 and sizes.scenario_sizes().b2_runs == 1
    with pytest.raises(SystemExit, match="unknown ablation size"):
        ablation.resolve_sizes(False, ["b4_messages=1"], env={})


def test_a_switch_is_read_when_a_product_source_names_it() -> None:
    assert ablation.read_by_product("CONSUMER_ACK_BATCH")
    assert ablation.read_by_product("BACKGROUND_NICE")  # scripts/launch.sh reads it
    assert ablation.read_by_product("LAUNCH_SLICES")
    assert not ablation.read_by_product("NO_SUCH_SWITCH_ANYWHERE")


def test_only_this_checkouts_servers_count_as_the_stacks() -> None:
    # The services of this checkout run (make test starts them); other clones' may run beside them.
    own = ablation_measure.own_server_roots()

    assert {kind: len(pids) for kind, pids in own.items()} == {"postgres": 1, "redis": 1, "rabbitmq": 1}
    argv = Path(f"/proc/{own['postgres'][0]}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("-D") + 1].startswith(str(ROOT / ".state"))


def test_the_stacks_postgres_is_the_server_at_its_database_url_wherever_its_data_lives() -> None:
    # A bench run from a git worktree of this checkout uses the servers this checkout started: their data is not
    # under the worktree's .state, so Postgres is found through DATABASE_URL (the parent of our backend), not a path.
    env = dict(os.environ)
    postmaster = ablation_measure.postmaster_pid(env["DATABASE_URL"])

    assert postmaster is not None and ablation_measure.own_server_roots(env)["postgres"] == [postmaster]
    # and a URL where no server answers counts no Postgres at all, rather than another clone's
    nowhere = {**env, "DATABASE_URL": "postgres://pilot:pilot@127.0.0.1:9/pilot_status"}
    assert "postgres" not in ablation_measure.own_server_roots(nowhere)


def _is_figure(value: object) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


@pytest.mark.harness
@pytest.mark.stack
@pytest.mark.timeout(960)  # as the bench smoke test: a whole harness run in a subprocess, its own stacks
def test_the_ablation_runs_each_variant_in_a_stack_of_its_own_and_writes_the_table(tmp_path: Path) -> None:
    # given: a bench database of its own, and two variants: all on, and the consumer's ACKs one by one
    env = dict(os.environ)
    env["BENCH_DATABASE_NAME"] = f"{env.get('TEST_DATABASE_NAME', 'test_pilot_status')}_bench_ablation_smoke"
    out, raw = tmp_path / "ablation.md", tmp_path / "ablation.json"

    # when
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--ablation", "--smoke", "--variants", "ack-batch",
         "--out", str(out), "--json", str(raw)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )

    # then: each variant ran once, in order, every figure of every scenario is a number
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    results = json.loads(raw.read_text())
    assert results["order"] == [REFERENCE, "ack-batch"]
    assert results["variants"]["ack-batch"]["env"] == {"CONSUMER_ACK_BATCH": "1"}
    for key in (REFERENCE, "ack-batch"):
        (slot,) = results["slots"][key]
        assert "error" not in slot
        assert slot["b1"]["every_202_stored"] is True and slot["b5"]["correct"] is True and slot["b3"]["all_sent"]
        assert slot["b2"]["with_otps"]["otps"] > 0 and slot["b2"]["with_otps"]["stream_error"] is None
        assert slot["b2"]["cpu_ms_per_message"]["stack"] > 0
        figures = results["summary"][key]["figures"]
        for name in ("b1_ratio", "b1_p99_ratio", "b3_ratio", "b5_ratio", "b2_cpu_ms", "b2_sent_rate_with_otps"):
            assert _is_figure(figures[name]["median"]), (key, name, figures[name])
    table = out.read_text()
    assert "| all on (today) | – |" in table and "| batched consumer ACKs | `CONSUMER_ACK_BATCH=1` |" in table
    assert "Smoke run" in table


def test_a_trial_variant_sets_any_setting_and_is_measured_against_all_on() -> None:
    chosen = select("ack-batch,env:RELAY_LANE_DEPTH_OTP=32,env:A_B=1+C=two")

    assert [v.key for v in chosen] == [REFERENCE, "ack-batch", "env:RELAY_LANE_DEPTH_OTP=32", "env:A_B=1+C=two"]
    assert chosen[2].env == {"RELAY_LANE_DEPTH_OTP": "32"}
    assert chosen[2].device == "RELAY_LANE_DEPTH_OTP=32"
    assert chosen[3].env == {"A_B": "1", "C": "two"}
    for bad in ("env:", "env:lower=1", "env:NAME=", "env:NAME"):
        with pytest.raises(SystemExit, match="not env:NAME=VALUE"):
            select(bad)


def test_a_part_that_fails_once_is_tried_again_and_the_slot_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a part that raises the first time (a shared host's load breaking a run), and a stack with nothing dead
    monkeypatch.setattr(ablation_measure.time, "sleep", lambda seconds: None)
    calls: list[int] = []

    def part() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("server closed the connection")
        return "measured"

    class Stack:
        def revive(self) -> list[str]:
            return []

    class Ctx:
        stack = Stack()

    slot: dict[str, Any] = {}
    logged: list[str] = []

    # when
    result = ablation_measure.attempt(Ctx(), slot, "B2", part, logged.append)

    # then: the second try's figure, and the first failure named in the slot and logged whole
    assert result == "measured" and len(calls) == 2
    assert slot["retried"] == {"B2": "ConnectionError: server closed the connection"}
    assert "Traceback" in logged[0]


def test_the_slices_switch_gets_no_verdict_on_a_host_where_the_launcher_makes_no_systemd_scope() -> None:
    results = _results()
    slices = next(v for v in VARIANTS if v.key == "slices")
    results["variants"]["slices"] = {"device": slices.device, "env": slices.env, "read_by_product": True}
    results["summary"]["slices"] = {"figures": _figures([_same(b3_ratio=2.0), _same(b3_ratio=2.2)]), "rounds": 2,
                                    "complete": True, "errors": 0}
    results["machine"]["launcher"] = "bulk at nice 10; " + ablation_table.NO_SLICES

    row = next(line for line in render(results) if line.startswith("| systemd slices"))

    assert row.endswith("| no systemd slices on this host, so the switch changed nothing here: noise |")
