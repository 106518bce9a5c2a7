"""The fault and abuse harness (chaos/), one scenario of each kind on small sizes, on the real stack.

`python -m chaos --smoke` (tests/chaos/conftest.py: one run for this file and test_chaos_abuse_smoke.py)
starts its own stack (gunicorn, relay, consumer, lane workers, the simulator behind chaos' TCP proxy) on a
database of its own, really stops Redis for a few seconds,
really SIGKILLs a lane worker and web, drives the gateway matrix and the abuse rows, and writes a
report. Each test below reads one row of that run. The full run is `make chaos` (docs/reliability.md).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chaos.conftest import SMOKE_ROWS as SUBSET

# A whole harness run in a subprocess (its own stack, at smoke sizes; tests/chaos/conftest.py): about 4 minutes on
# an idle 2-core machine, more on a loaded one. pytest.ini's 180 s would interrupt it and leave its stack's
# processes running on the test broker, where they take the next stack tests' tasks; the subprocess's own
# timeout (conftest.py) is the bound.
pytestmark = [pytest.mark.timeout(960), pytest.mark.harness, pytest.mark.stack]


@pytest.fixture(scope="module")
def run(chaos_run: dict[str, Any]) -> dict[str, Any]:
    return chaos_run


def row(run: dict[str, Any], name: str) -> dict[str, Any]:
    assert name not in run["errors"], run["errors"].get(name)
    result = run["scenarios"][name]
    assert result["passed"], json.dumps(result.get("figures"), indent=1, default=str) + "\n" + run["output"]
    return result["figures"]


def test_it_accepts_every_send_and_loses_none_while_redis_is_really_stopped(run):
    figures = row(run, "R1")
    assert figures["sends_while_redis_down"] > 0
    assert figures["answers"]["202"] == figures["sends"] and figures["lost"] == 0


def test_it_loses_nothing_and_sends_at_most_once_per_kill_when_the_lane_worker_is_sigkilled(run):
    figures = row(run, "R4")
    assert figures["kills"] >= 1 and figures["lost"] == 0
    assert figures["duplicate_sendtext_calls"] <= figures["kills"]


def test_it_ends_every_message_in_its_true_status_when_web_dies_during_a_receipt_storm(run):
    figures = row(run, "R5")
    assert figures["web_restarts"] >= 1 and figures["ghost_statuses"] == 0


def test_it_ends_every_gateway_fault_in_the_right_state_and_reason(run):
    figures = row(run, "R6")
    assert figures["right"] == figures["cases"] and figures["lost"] == 0


def test_it_answers_every_generated_request_within_the_schema_without_server_errors(run):
    figures = row(run, "S1")
    assert figures["server_error_findings"] == 0 and figures["outside_schema_findings"] == 0


def test_it_answers_404_to_another_tenant_on_every_route_and_changes_nothing(run):
    figures = row(run, "S2")
    assert figures["a_unchanged"] and not figures["unexpected"]


def test_it_refuses_unauthenticated_and_forged_webhooks_with_401_and_stores_nothing(run):
    figures = row(run, "S3")
    assert figures["inbox_rows_added"] == 0 and not figures["unexpected"]


def test_it_answers_bad_input_with_a_clear_4xx_json_error_and_stores_nothing(run):
    figures = row(run, "S4")
    assert figures["server_errors"] == 0 and not figures["unexpected"]


def test_it_keeps_no_raw_key_or_token_in_the_database_or_the_logs(run):
    figures = row(run, "S5")
    assert figures["logs_searched"] > 0
    assert not figures["tables_holding_a_secret"] and not figures["logs_holding_a_secret"]


def test_it_writes_a_report_with_a_row_per_scenario(run):
    for name in SUBSET:
        assert f"| {name} |" in run["report"]
    assert "## Findings" in run["report"]


def test_lost_answers_never_send_a_message_twice_nor_report_an_unsent_one_sent(run):
    for name in ("R8", "R8I"):  # Evolution honouring the WhatsApp id we choose, and ignoring it
        figures = row(run, name)
        assert figures["answers_lost_after_send"] + figures["answers_lost_before_send"] > 0
        assert figures["wrong"] == 0 and figures["lost"] == 0 and figures["most_reached_for_one_message"] <= 1


def test_with_our_ids_every_lost_answer_is_resolved_by_them(run):
    figures = row(run, "R8")
    assert figures["ids"] == "honoured"
    assert figures["messages_left_unknown_a_while"] == 0 and figures["outcome_unknown"] == 0


def test_two_of_every_scalable_process_lose_nothing_send_nothing_twice_and_stay_fair(run):
    figures = row(run, "R10")
    assert all(n >= 2 for n in figures["queue_consumers"].values()) and figures["relay_heartbeats"] >= 2
    # every Celery queue, the maintenance and callbacks ones too, and Evolution's ingest queue
    assert set(figures["queue_consumers"]) == {"otp", "utility", "marketing", "ingest", "maintenance", "sync", "bulk",
                                               "callbacks", "callbacks_relay"}
    assert {"webhook-1", "webhook-2", "worker-callbacks-1", "worker-callbacks-2", "beat"} <= set(figures["processes"])
    assert figures["copies_alive_at_end"]
    # one beat per database: the second exits with beat_lock's status 3 and names the first
    assert figures["second_beat_exit_status"] == 3 and "another beat already runs" in figures["second_beat"]["said"]
    assert figures["c_callbacks_owed"] > 0 and figures["c_callbacks_lost"] == 0
    assert figures["c_callbacks"]["bad_signatures"] == 0
    assert len(figures["accepted_per_web_pool"]) == 2
    assert figures["inbox_rows_by_channel"]["WEBHOOK"] > 0 and figures["inbox_rows_by_channel"]["RABBITMQ"] > 0
    assert figures["lost"] == 0 and figures["duplicate_sendtext_calls"] == 0
    assert figures["fairness_ratio"] <= 2.0


def test_a_new_numbers_cold_campaign_keeps_it_unrestricted_under_the_policy_and_gets_it_restricted_without(run):
    figures = row(run, "R11")
    assert figures["policy_sent"] > 0 and figures["policy_lost"] == 0
    assert not figures["policy_restricted"] and figures["policy_disconnects"] == 0
    assert figures["off_restricted"] and figures["off_lost"] == 0
