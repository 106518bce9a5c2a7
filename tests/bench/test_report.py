"""docs/benchmarks.md as bench.report renders it: one summary table, then one appendix section per scenario measured.

The recorded JSONs: the full `make bench` at 31e23a4 (B1–B6 and profiles, no B8, no ablation), the figures that
docs/benchmarks.md shows, a smoke run of every scenario (B8 too, before B7 existed), and `--only B7` at 3dd203c (1,000
messages, one run, on a machine loaded by other work); nothing here starts a stack.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench import ablation_table, report

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).with_name("recorded") / "results-31e23a4.json"


@pytest.fixture
def results() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(RECORDED.read_text())
    return loaded


def _headings(text: str, level: str) -> list[str]:
    return [line[len(level) + 1:] for line in text.splitlines() if line.startswith(level + " ")]


def _summary_rows(text: str) -> list[str]:
    table = text.split("## Summary", 1)[1].split("## Appendix", 1)[0]
    return [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "---" not in line]


def test_a_recorded_run_renders_one_summary_table_and_one_appendix_section_per_scenario(results: dict[str, Any]) -> None:
    # when
    text = report.render(results)

    # then: the page is a header, the summary and the appendix, nothing else at the top level
    assert _headings(text, "#") == ["Benchmarks"]
    assert _headings(text, "##") == ["Summary", "Appendix"]
    assert text.count("| id | figure (median, min–max) | baseline, same run | ratio | target | status |") == 1
    # one summary row per scenario in order (M with B2), and B7 to B9, absent from this run, said so
    assert _summary_rows(text) == ["id", "B1", "B2", "M", "B3", "B4", "B5", "B6", "B7", "B8", "B9"]
    assert "| B7 | not measured in this run |" in text
    assert "| B8 | not measured in this run |" in text
    assert "| B9 | not measured in this run |" in text
    # one appendix section per scenario present, in the same order, none for B8
    sections = [title.split()[0] for title in _headings(text, "###")]
    assert sections == ["B1", "B2", "B3", "B4", "B5", "B6"]
    # each profile sits in the appendix of the scenario it was taken in
    b1 = text.split("### B1", 1)[1].split("### B2", 1)[0]
    assert "Profile P1 web (B1 funnel)" in b1 and "Profile P2" not in b1
    # the header says what was measured where, and how to run it
    assert "measured at commit `31e23a4`" in text
    assert "make bench" in text and "--report-only" in text


@pytest.mark.parametrize("recording", ["results-31e23a4.json", "smoke.json", "b7-3dd203c.json"])
def test_each_scenario_in_a_recording_has_its_summary_row_and_its_appendix_section(recording: str) -> None:
    # given: the full run at 31e23a4 (B1-B6, profiles), and a smoke run of every scenario (B8 too, no profiles)
    results = json.loads((RECORDED.parent / recording).read_text())

    text = report.render(results)

    present = [name for name in report.SCENARIOS if name in results["scenarios"]]
    assert _headings(text, "##") == ["Summary", "Appendix"]
    assert [title.split()[0] for title in _headings(text, "###")] == present
    rows = _summary_rows(text)
    assert all(name in rows for name in present) and rows.count("id") == 1


def test_the_report_carries_no_history(results: dict[str, Any]) -> None:
    text = report.render(results)

    # findings.md is linked, not pasted in; no session diary
    assert "# Why the stack is set up as it is" not in text
    assert not re.search(r"\bsession \d+", text, re.IGNORECASE)


def test_every_why_link_names_a_section_of_findings(results: dict[str, Any]) -> None:
    findings = (ROOT / "bench" / "findings.md").read_text()
    anchors = {report._anchor(title) for title in _headings(findings, "##")}

    linked = re.findall(r"\]\(\.\./bench/findings\.md#([^)]+)\)", report.render(results))

    assert linked and set(linked) <= anchors


def test_a_json_without_most_scenarios_still_renders(results: dict[str, Any]) -> None:
    # given: only B3 was run, and B5 failed
    results["scenarios"] = {"B3": results["scenarios"]["B3"]}
    results["errors"] = {"B5": "Traceback …\nRuntimeError: the simulator went away\n"}
    results.pop("profiles")

    text = report.render(results)

    assert [title.split()[0] for title in _headings(text, "###")] == ["B3"]
    assert "| B5 | failed: `RuntimeError: the simulator went away` |" in text
    assert "| B1 | not measured in this run |" in text


def test_the_ablation_section_comes_from_bench_ablation_table(results: dict[str, Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    results["ablation"] = {"devices": ["otp_window"]}
    seen: list[Any] = []

    def render(given: Any) -> list[str]:
        seen.append(given)
        return ["| device | B1 | B3 |", "|---|---|---|", "| otp_window | 0.78× | 1.87× |"]

    monkeypatch.setattr(report, "render_ablation", render)

    text = report.render(results)

    assert seen == [{"devices": ["otp_window"]}]
    assert _headings(text, "###")[-1] == "Ablation"
    assert "| otp_window | 0.78× | 1.87× |" in text.split("### Ablation", 1)[1]


def test_the_paired_table_follows_the_ablation_with_its_own_commit(results: dict[str, Any]) -> None:
    results["paired"] = {"machine": {"commit": "abc1234", "date": "2026-12-02 10:00 UTC", "load_before": [1, 1, 1]},
                         "rounds": 8, "accepts_per_block": 1000, "devices": [
                             {"device": "second validator", "setting": "SEND_PLAIN_VALIDATOR=0", "unit": "accept",
                              "on": [{"python": 1.7, "postgres": 0.5}] * 8, "off": [{"python": 2.0, "postgres": 0.5}] * 8,
                              "ratios": [1.15] * 8, "median_ratio": 1.15, "verdict": "earns its place"}]}

    text = report.render(results)

    section = text.split("### The accept path's devices, paired in one process", 1)[1]
    assert section.lstrip().startswith("Commit `abc1234`, 2026-12-02 10:00 UTC")
    assert "| second validator | `SEND_PLAIN_VALIDATOR=0` | 2.200 → 2.500 ms per accept | 1.150× (1.150–1.150) | +15.0 %" in section


def test_under_the_device_tables_the_page_names_the_switches_removed_since_with_the_device_kept(
        results: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a paired run that measured two switches, one of which the product no longer has
    monkeypatch.setattr(ablation_table, "REMOVED", {"SEND_PLAIN_VALIDATOR": "second validator"})
    device = {"unit": "accept", "on": [{"python": 1.7, "postgres": 0.5}] * 8, "off": [{"python": 2.0, "postgres": 0.5}] * 8,
              "ratios": [1.15] * 8, "median_ratio": 1.15, "verdict": "earns its place"}
    results["paired"] = {"machine": {"commit": "abc1234"}, "rounds": 8, "accepts_per_block": 1000, "devices": [
        {**device, "device": "second validator", "setting": "SEND_PLAIN_VALIDATOR=0"},
        {**device, "device": "remembered routing guards", "setting": "ACCEPT_REMEMBER_ROUTING=0"}]}

    # when
    section = report.render(results).split("### The accept path's devices, paired in one process", 1)[1]

    # then: both rows as measured, and under them the note naming only the removed switch
    assert "| second validator | `SEND_PLAIN_VALIDATOR=0` |" in section
    note = next(line for line in section.splitlines() if line.startswith("Removed after these runs:"))
    assert note.startswith("Removed after these runs: `SEND_PLAIN_VALIDATOR` (second validator). ")
    assert "ACCEPT_REMEMBER_ROUTING" not in note and "only path" in note
    # and a page whose tables name no removed switch says nothing of it
    monkeypatch.setattr(ablation_table, "REMOVED", {})
    assert "Removed after these runs" not in report.render(results)


def test_a_switch_removed_with_its_device_is_named_apart_from_the_kept_devices() -> None:
    # given: the tables name a kept device's switch, a switch whose device went too, and a switch still read
    switches = ["SEND_PLAIN_VALIDATOR", "GATEWAY_ADAPTIVE_LIMIT", "CONSUMER_ACK_BATCH"]

    # when
    note = [line for line in ablation_table.removed_note(switches) if line]

    # then: one line for each kind, the switch still read named in neither
    assert note[0].startswith("Removed after these runs: `SEND_PLAIN_VALIDATOR` (second validator).")
    assert note[1].startswith("Removed with its device after these runs: `GATEWAY_ADAPTIVE_LIMIT` (adaptive gateway limit).")
    assert len(note) == 2 and not any("CONSUMER_ACK_BATCH" in line for line in note)


def test_without_an_ablation_in_the_json_there_is_no_ablation_section(results: dict[str, Any]) -> None:
    text = report.render(results)

    assert "Ablation" not in text
    assert "paired in one process" not in text
    assert [title.split()[0] for title in _headings(text, "###")][-1] == "B6"


def test_b7_is_reported_against_its_baseline_with_its_cpu_per_delivery_and_judged_by_no_target() -> None:
    # given: B7 alone at 3dd203c
    results = json.loads((RECORDED.parent / "b7-3dd203c.json").read_text())

    text = report.render(results)

    row = next(line for line in text.splitlines() if line.startswith("| B7 |"))
    assert "21 callback deliveries/s" in row and "trivial tasks 244 /s" in row and "| 0.09× |" in row
    assert "callbacks worker 10.10 ms" in row and row.endswith("| none stated (issue 23) | report only |")
    b7 = text.split("### B7", 1)[1]
    assert "| 1 | 244 | 21 | 22 | 21 | 3,118 / 3,118 / 3,118 |" in b7
    # the share of a core the callbacks worker had, and what a whole core would deliver at its CPU per delivery
    assert "callbacks worker had 22 % of one core" in b7 and "about 99/s" in b7


def _with_otps(ratios: list[float], shares: list[float]) -> dict[str, Any]:
    from bench.scenarios import b2_otp_neighbour

    runs = [{"sent_rate": 50 * r, "read_rate": 40 * r, "all_sent": True, "all_read": True, "sent_s": 30.0,
             "alone_sent_rate": 50.0, "ratio": r, "otps": 600, "otps_all_sent": True, "otp_p99_ms": 120.0,
             "stream_error": None, "cpu_s": 60.0, "alone_cpu_s": 40.0, "wall_s": 30.0, "otp_cpu_ms": 33.3,
             "otp_cpu_share": share, "kept_of_left": r / (1 - share)} for r, share in zip(ratios, shares)]
    return b2_otp_neighbour.summary(20.0, runs)


def test_b2_beside_another_tenants_otps_is_its_own_row_judged_at_half_of_b2_alone(results: dict[str, Any]) -> None:
    # given: two pairs, B2 keeping 0.62 and 0.48 of its rate alone while the OTPs took 30 and 40 % of the machine
    results["scenarios"]["B2"]["with_otps"] = _with_otps([0.62, 0.48], [0.30, 0.40])

    text = report.render(results)

    # then: the row follows M, judged on the median ratio (0.55 ≥ 0.5), with the share the OTPs' own work took
    assert _summary_rows(text)[:5] == ["id", "B1", "B2", "M", "B2o"]
    row = next(line for line in text.splitlines() if line.startswith("| B2o |"))
    assert "20 OTP/s" in row and "35 (30–40) % of the machine" in row
    assert "0.55 (0.48–0.62)×" in row and "of the CPU the OTPs left: 0.84 (0.80–0.89)×" in row
    assert row.endswith("| **met** |")
    # and the B2 appendix has one line per pair
    b2 = text.split("### B2", 1)[1].split("### B3", 1)[0]
    assert "| 2 | 50 | 24 | 0.48× | 600 | 120 ms | 33 ms | 40 % | 0.80× |" in b2


def test_b2_beside_otps_is_not_met_when_halved_or_when_an_otp_was_not_sent() -> None:
    from bench.scenarios import b2_otp_neighbour

    assert not _with_otps([0.45, 0.52, 0.40], [0.3, 0.3, 0.3])["met"]
    lost = _with_otps([0.9], [0.3])
    lost["runs"][0]["otps_all_sent"] = False
    assert not b2_otp_neighbour.summary(20.0, lost["runs"])["met"]


def test_a_recording_from_before_the_otp_neighbour_has_no_b2o_row(results: dict[str, Any]) -> None:
    assert "with_otps" not in results["scenarios"]["B2"]
    assert "| B2o |" not in report.render(results)


def test_docs_benchmarks_is_what_the_runs_kept_in_bench_results_render() -> None:
    # given: the runs the page was rendered from, kept beside the code (a page whose data is lost cannot be
    # rendered again when one section changes)
    from bench.__main__ import kept_results, with_ablation

    path, ablation, paired = kept_results(None, None)
    assert ablation is not None and paired is not None  # the device tables come from kept runs too

    # when
    text = report.render(with_ablation(json.loads(path.read_text()), ablation, paired))

    # then
    assert text == (ROOT / "docs" / "benchmarks.md").read_text()


def test_the_b2_appendix_says_where_an_otps_cpu_went_by_process_kind(results: dict[str, Any]) -> None:
    with_otps = _with_otps([0.62, 0.48], [0.30, 0.40])
    with_otps["runs"][1]["otp_alone"] = {"cpu_ms_by_kind": {"web": 4.6, "webhook": 12.7, "relay": -0.4}}
    results["scenarios"]["B2"]["with_otps"] = with_otps

    b2 = report.render(results).split("### B2", 1)[1].split("### B3", 1)[0]

    assert "- run 2: webhook 12.7, web 4.6, relay -0.4" in b2
    assert "- run 1:" not in b2  # a run recorded before the breakdown has none


def test_a_scenario_kept_twice_keeps_the_date_it_was_measured() -> None:
    # given: a run at 14:08 that measured B2 and kept B1 from a run at 12:59
    from bench.__main__ import _keep_previous

    previous = {"machine": {"date": "14:08"}, "scenarios": {"B1": {"x": 1}, "B2": {"x": 2}},
                "kept": {"B1": "12:59", "profiles": "12:59"}, "profiles": {"P1": {}}}
    results: dict[str, Any] = {"scenarios": {"B3": {}}, "errors": {}}

    _keep_previous(results, previous)

    assert results["kept"] == {"B1": "12:59", "B2": "14:08", "profiles": "12:59"}


def test_a_run_saved_after_a_scenario_still_holds_what_it_keeps(tmp_path: Path) -> None:
    # given: a --keep run that has measured B3 so far, over a results file holding B1 and B2
    from bench.__main__ import _save

    previous = {"machine": {"date": "14:08"}, "scenarios": {"B1": {"x": 1}, "B2": {"x": 2}}}
    results: dict[str, Any] = {"scenarios": {"B3": {"x": 3}}, "errors": {}}
    path = tmp_path / "results.json"

    # when: it saves after the scenario (the file it read B1 and B2 from), then crashes
    _save(results, path, previous)

    # then: the file still has B1 and B2, said to be kept, and the run's own results are unchanged
    saved = json.loads(path.read_text())
    assert set(saved["scenarios"]) == {"B1", "B2", "B3"}
    assert saved["kept"] == {"B1": "14:08", "B2": "14:08"}
    assert results == {"scenarios": {"B3": {"x": 3}}, "errors": {}}


def test_the_runs_per_figure_count_a_kept_scenarios_own_runs(results: dict[str, Any]) -> None:
    # given: B2 kept from a run of three pairs, in a run whose own size was two
    results["sizes"]["b2_runs"] = 2
    results["scenarios"]["B2"]["runs"] = [results["scenarios"]["B2"]["runs"][0]] * 3

    line = next(x for x in report.render(results).splitlines() if x.startswith("- Runs per figure"))

    assert "B2: 3," in line


def test_the_b3_appendix_says_how_busy_the_machine_was_while_each_stream_ran(results: dict[str, Any]) -> None:
    # given: B3's runs with the machine's CPU measured over each stream (older recordings have none)
    b3 = results["scenarios"]["B3"]
    for run in b3["idle"]["runs"]:
        run["stream_cpu"] = {"machine_busy_share": 0.41, "share": {"callbacks": 0.19, "webhook": 0.12}}
    for run in b3["backlog_run"]["runs"]:
        run["stream_cpu"] = {"machine_busy_share": 0.93,
                             "share": {"webhook": 0.43, "callbacks": 0.25, "postgres": 0.19, "redis": 0.004}}

    # when
    appendix = report.render(results).split("### B3", 1)[1].split("### B4", 1)[0]

    # then: a column per stream, and who used the machine during the streams with backlog
    rows = [line for line in appendix.splitlines() if line.startswith("| 1 |")]
    assert "| 41% |" in rows[0] and "| 93% |" in rows[1]
    assert "run 1: webhook 43%, callbacks 25%, postgres 19%;" in appendix  # under 1 % left out
    assert "redis" not in appendix.split("Who used it", 1)[1].split("\n", 1)[0]


def test_a_b3_recording_without_the_streams_cpu_renders_a_dash(results: dict[str, Any]) -> None:
    appendix = report.render(results).split("### B3", 1)[1].split("### B4", 1)[0]

    assert "machine busy" in appendix
    assert "Who used it" not in appendix
    assert all("| – |" in line for line in appendix.splitlines() if line.startswith("| 1 |"))


def test_the_header_says_how_the_launcher_set_the_priorities():
    nice = {"relay": 10, "web": 0}
    said = "bulk at nice 10; no systemd slices on this host"
    assert f"relay at nice 10 (scripts/launch.sh: {said})" in report._priorities_text(nice, said)
    # Runs from before the launcher: pilot_status.priority, with its idle CPU group or without.
    assert "(their sessions too), in an idle CPU group, a group of its own each (6 processes)" in report._priorities_text(
        nice, None, 6)
    assert "no idle CPU group" in report._priorities_text(nice, None, None)
    assert "where the host allowed it" in report._priorities_text(nice)
    assert report._priorities_text({"relay": 0}, said) == "every process at normal priority"
