"""The ban model: strikes (463) for parallel, fast or cold sends, then a disconnect, then a ban; the
never-acknowledged fault; the time scale; off by default."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from .conftest import API_KEY, Json, Receiver, Simulator, sample, shape, start_simulator, wait_for

# Every rule out of reach: a test turns on only the rule it is about.
LENIENT: Json = {"enabled": True, "max_in_flight": 1000, "min_gap_s": 0, "rate_limits": [],
                 "cold_max": 1_000_000, "cold_window_s": 1e9, "number_age_days": 1000,
                 "strikes_to_disconnect": 1000, "strike_window_s": 1e9, "disconnects_to_ban": 1000,
                 "ban_window_s": 1e9, "timelock_s": 0}


def _strict(sim: Simulator, **rules: Any) -> Json:
    config: Json = sim.instance("my-instance", ban_model={**LENIENT, **rules})
    return config


def _standing(sim: Simulator, name: str = "my-instance") -> Any:
    return sim.http.get(f"{sim.url}/_control/instances/{name}", timeout=10).json()["standing"]


def _send(sim: Simulator, number: str, text: str = "Olá", instance: str = "my-instance") -> requests.Response:
    return sim.send_text(instance, number=number, text=text)


def _outcomes(sim: Simulator) -> list[Any]:
    return [s["wa_outcome"] for s in sim.sends()]


def _rules(entry: Json) -> list[str]:
    return [t["rule"] for t in entry["triggers"]]


def test_off_by_default_a_machine_pace_is_accepted(sim: Simulator, inst: Json) -> None:
    config = sim.http.get(f"{sim.url}/_control/global", timeout=10).json()
    assert config["ban_model"]["enabled"] is False and config["time_scale"] == 1
    sim.instance("my-instance", faults={"send_latency_ms": 100})  # so that the sends overlap
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: _send(sim, f"55119000000{n:02d}"), range(24)))
    assert {a.status_code for a in answers} == {201}
    assert set(_outcomes(sim)) == {"accepted"}
    standing = _standing(sim)
    assert (standing["enabled"], standing["status"], standing["strikes"], standing["history"]) == (
        False, "ok", 0, [])
    assert standing["max_in_flight"] >= 2 and standing["warm_contacts"] == 24


def test_parallel_sends_get_463_as_evolution_surfaces_it(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _strict(sim, max_in_flight=1)
    sim.instance("my-instance", webhook={"url": receiver.url + "/hook", "events": ["MESSAGES_UPDATE"]},
                 faults={"send_latency_ms": 400, "ack_delays_ms": {"DELIVERY_ACK": None, "READ": None}})
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda n: _send(sim, f"551190000000{n}"), range(4)))
    # WhatsApp takes every stanza (201 PENDING); the nack comes after, as a receipt.
    assert [(a.status_code, a.json()["status"]) for a in answers] == [(201, "PENDING")] * 4
    refused = [s for s in sim.sends() if s["wa_outcome"] == "463"]
    assert len(refused) >= 2
    errors = wait_for(lambda: [b for b in receiver.bodies() if b["data"]["status"] == "ERROR"]
                      if len(receiver.bodies()) == 4 else None)
    assert sorted(b["data"]["keyId"] for b in errors) == sorted(s["id"] for s in refused)
    for body in errors:
        # Evolution's messages.update carries no messageStubParameters: the 463 is only in its log.
        assert shape(body) == shape(sample("webhook.messages.update.ERROR.json"))
        rows = sim.post("/chat/findStatusMessage/my-instance", {"where": {"id": body["data"]["keyId"]}}).json()
        assert [r["status"] for r in rows] == ["ERROR"]
    standing = _standing(sim)
    assert (standing["status"], standing["strikes"], standing["banned"]) == ("warned", len(refused), False)
    assert all(_rules(h) == ["parallel"] and h["error"] == 463 for h in standing["history"])
    # A refused send does not make the contact warm.
    assert standing["warm_contacts"] == 4 - len(refused)


def test_one_at_a_time_is_never_parallel(sim: Simulator, inst: Json) -> None:
    _strict(sim, max_in_flight=1)
    sim.instance("my-instance", faults={"send_latency_ms": 50})
    for n in range(3):
        assert _send(sim, f"551190000000{n}").status_code == 201
    assert _outcomes(sim) == ["accepted"] * 3


def test_sends_closer_than_the_minimum_gap_strike_and_the_time_scale_shortens_it(
        sim: Simulator, inst: Json) -> None:
    _strict(sim, min_gap_s=3600)
    _send(sim, "5511900000001")
    _send(sim, "5511900000002")
    assert _outcomes(sim) == ["accepted", "463"]
    gap = _standing(sim)["history"][0]["triggers"][0]
    assert gap["rule"] == "gap" and gap["limit"] == 3600 and gap["gap_s"] < 3600
    # An hour of model time passes in 36 ms at 100000: the next send is an hour later.
    sim.control("global", {"time_scale": 100000})
    time.sleep(0.2)
    _send(sim, "5511900000003")
    assert _outcomes(sim)[-1] == "accepted"


def test_more_sends_than_the_window_allows_strike(sim: Simulator, inst: Json) -> None:
    _strict(sim, rate_limits=[{"window_s": 3600, "max": 3}])
    for n in range(5):
        _send(sim, f"551190000000{n}")
    assert _outcomes(sim) == ["accepted"] * 3 + ["463"] * 2
    rate = _standing(sim)["history"][0]["triggers"][0]
    assert (rate["rule"], rate["window_s"], rate["sends"], rate["limit"]) == ("rate", 3600, 4, 3)


def test_a_new_number_gets_part_of_the_allowance_and_grows_into_it(sim: Simulator, inst: Json) -> None:
    _strict(sim, rate_limits=[{"window_s": 1e9, "max": 8}], number_age_days=0, warmup_days=14, warmup_start=0.25)
    assert _standing(sim)["allowance"]["rate"][0]["max"] == 2  # a quarter on day 0
    for n in range(3):
        _send(sim, f"551190000000{n}")
    assert _outcomes(sim) == ["accepted", "accepted", "463"]
    # A week of model time later (half the warm-up): at least 0.25 + 0.75 * 7/14 of 8 = 5.
    sim.control("global", {"time_scale": 1_000_000})
    time.sleep(0.61)
    sim.control("global", {"time_scale": 1})
    standing = _standing(sim)
    assert standing["age_days"] >= 7
    assert standing["allowance"]["rate"][0]["max"] == int(8 * (0.25 + 0.75 * min(standing["age_days"], 14) / 14))
    assert standing["allowance"]["rate"][0]["max"] >= 5
    _send(sim, "5511900000009")
    assert _outcomes(sim)[-1] == "accepted"


def test_cold_contacts_beyond_the_quota_strike_then_reach_out_is_locked(
        sim: Simulator, inst: Json) -> None:
    _strict(sim, cold_max=2, timelock_s=86400)
    for number in ("5511900000001", "5511900000002", "5511900000003"):
        _send(sim, number)
    assert _outcomes(sim) == ["accepted", "accepted", "463"]
    assert _rules(_standing(sim)["history"][0]) == ["cold"]
    # Time-locked: the next cold contact is refused too; a contact already talked to is not.
    _send(sim, "5511900000004")
    _send(sim, "5511900000001")
    assert _outcomes(sim)[-2:] == ["463", "accepted"]
    assert _rules(_standing(sim)["history"][1]) == ["timelock", "cold"]
    standing = _standing(sim)
    assert standing["timelocked"] is True and standing["allowance"]["cold"]["sent"] == 4


def test_a_contact_who_wrote_first_is_warm(sim: Simulator, inst: Json) -> None:
    _strict(sim, cold_max=1, timelock_s=86400)
    _send(sim, "5511900000001")
    _send(sim, "5511900000002")
    assert _outcomes(sim) == ["accepted", "463"]  # time-locked from now on
    # An inbound upsert emitted through the control API ...
    data = sample("webhook.messages.upsert.inbound-text.json")["data"]
    data["key"]["remoteJid"] = "5511900000003@s.whatsapp.net"
    sim.control("emit", {"instance": "my-instance", "event": "messages.upsert", "data": data})
    # ... a message from the contact, a message typed on the phone, or a contact declared warm.
    for body in ({"number": "5511900000004", "text": "Oi", "from_me": False},
                 {"number": "5511900000005", "text": "Oi", "from_me": True}):
        sim.control("instances/my-instance/messages", body)
    sim.control("instances/my-instance/standing", {"warm": ["+55 11 90000-0006"]})
    for n in range(3, 7):
        _send(sim, f"551190000000{n}")
    assert _outcomes(sim)[2:] == ["accepted"] * 4
    _send(sim, "5511900000007")
    assert _outcomes(sim)[-1] == "463"


def test_strikes_disconnect_the_number_then_a_second_disconnect_bans_it(
        sim: Simulator, receiver: Receiver, inst: Json) -> None:
    # Each cold contact after the first is a strike; two strikes close the session for an hour of model
    # time (0.1 s at 36000); two disconnects ban the number.
    sim.control("global", {"time_scale": 36000})
    _strict(sim, cold_max=1, strikes_to_disconnect=2, disconnect_s=3600, disconnects_to_ban=2)
    sim.instance("my-instance", webhook={"url": receiver.url + "/hook", "events": ["CONNECTION_UPDATE"]})
    for n in range(3):
        assert _send(sim, f"551190000000{n}").status_code == 201
    assert _outcomes(sim) == ["accepted", "463", "463"]
    closed = _send(sim, "5511900000009")
    assert (closed.status_code, closed.json()) == (500, sample("error.500.connection-closed.json"))
    states = wait_for(lambda: [(b["data"]["state"], b["data"]["statusReason"]) for b in receiver.bodies()]
                      if len(receiver.bodies()) >= 3 else None, timeout=5)
    # Logged out (the linked device removed), then paired again once the hour has passed.
    assert states == [("close", 401), ("connecting", 200), ("open", 200)]
    assert _standing(sim)["status"] == "ok"  # a new session: its strikes start again (no time-lock here)
    for n in range(3, 5):
        assert _send(sim, f"551190000000{n}").status_code == 201
    assert _outcomes(sim)[-2:] == ["463", "463"]
    wait_for(lambda: len(receiver.bodies()) == 4)
    assert receiver.bodies()[-1]["data"] == {"instance": "my-instance", "state": "close", "statusReason": 403}
    time.sleep(0.3)  # a ban is for good: no pairing again
    assert len(receiver.bodies()) == 4
    assert sim.get("/instance/connectionState/my-instance").json()["instance"]["state"] == "close"
    assert _send(sim, "5511900000001").status_code == 500
    standing = _standing(sim)
    assert (standing["status"], standing["banned"], standing["strikes"], standing["disconnects"]) == (
        "banned", True, 4, 2)
    assert [h["kind"] for h in standing["history"]] == [
        "strike", "strike", "disconnect", "reconnect", "strike", "strike", "ban"]
    everyone = sim.http.get(f"{sim.url}/_control/standing", timeout=10).json()
    assert everyone["banned"] == ["my-instance"] and everyone["time_scale"] == 36000
    # The control API will not open a banned number until its standing is cleared.
    refused = sim.http.post(f"{sim.url}/_control/instances/my-instance", json={"state": "open"}, timeout=10)
    assert refused.status_code == 409 and "banned" in refused.json()["error"]
    assert sim.control("instances/my-instance/standing", {"clear": True})["status"] == "ok"
    sim.instance("my-instance", state="open")
    assert _send(sim, "5511900000001").status_code == 201


def test_disconnect_s_null_keeps_the_number_closed(sim: Simulator, inst: Json) -> None:
    sim.control("global", {"time_scale": 36000})
    _strict(sim, cold_max=1, strikes_to_disconnect=1, disconnect_s=None)
    _send(sim, "5511900000001")
    _send(sim, "5511900000002")
    time.sleep(0.3)
    assert _standing(sim)["status"] == "disconnected"
    assert sim.get("/instance/connectionState/my-instance").json()["instance"]["state"] == "close"
    assert sim.http.get(f"{sim.url}/_control/standing", timeout=10).json()["disconnected"] == ["my-instance"]


def test_strikes_older_than_their_window_are_forgotten(sim: Simulator, inst: Json) -> None:
    sim.control("global", {"time_scale": 36000})  # an hour of model time in 0.1 s
    _strict(sim, cold_max=1, strike_window_s=3600, strikes_to_disconnect=2)
    _send(sim, "5511900000001")
    _send(sim, "5511900000002")
    assert (_standing(sim)["status"], _standing(sim)["strikes_in_window"]) == ("warned", 1)
    time.sleep(0.2)
    standing = _standing(sim)
    assert (standing["status"], standing["strikes"], standing["strikes_in_window"]) == ("ok", 1, 0)
    _send(sim, "5511900000003")  # one strike in the window again: no disconnect
    assert _standing(sim)["status"] == "warned" and _standing(sim)["disconnects"] == 0


def test_a_new_time_scale_applies_to_a_disconnect_under_way(sim: Simulator, inst: Json) -> None:
    _strict(sim, cold_max=1, strikes_to_disconnect=1, disconnect_s=3600)
    _send(sim, "5511900000001")
    _send(sim, "5511900000002")
    assert _standing(sim)["status"] == "disconnected"  # for an hour at time scale 1
    sim.control("global", {"time_scale": 1_000_000})
    wait_for(lambda: sim.get("/instance/connectionState/my-instance").json()["instance"]["state"] == "open",
             timeout=3)
    assert _standing(sim)["history"][-1]["kind"] == "reconnect"


def test_the_global_switch_covers_baileys_numbers_only(sim: Simulator, inst: Json) -> None:
    rules = {**LENIENT, "enabled": True, "cold_max": 1}
    assert sim.control("global", {"ban_model": rules})["ban_model"]["cold_max"] == 1
    sim.instance("cloud-api", integration="WHATSAPP-BUSINESS")
    sim.instance("opted-out", ban_model={"enabled": False})
    for name in ("my-instance", "cloud-api", "opted-out"):
        for n in range(2):
            _send(sim, f"551190000000{n}", instance=name)
    by_instance = {name: [s["wa_outcome"] for s in sim.sends(instance=name)]
                   for name in ("my-instance", "cloud-api", "opted-out")}
    assert by_instance == {"my-instance": ["accepted", "463"], "cloud-api": ["accepted"] * 2,
                           "opted-out": ["accepted"] * 2}
    assert _standing(sim, "cloud-api")["enabled"] is False
    sim.control("reset", {"global": True})
    assert sim.http.get(f"{sim.url}/_control/global", timeout=10).json()["ban_model"]["enabled"] is False


def test_the_time_scale_is_one_number_the_control_api_reports(sim: Simulator) -> None:
    assert sim.control("global", {"time_scale": 1000})["time_scale"] == 1000
    before = sim.http.get(f"{sim.url}/_control/standing", timeout=10).json()
    time.sleep(0.2)
    after = sim.http.get(f"{sim.url}/_control/standing", timeout=10).json()
    assert after["time_scale"] == 1000 and 150 <= after["model_now_s"] - before["model_now_s"] <= 1000
    for bad in (0, -1, "fast", None, 1e7):
        response = sim.http.post(f"{sim.url}/_control/global", json={"time_scale": bad}, timeout=10)
        assert response.status_code == 400 and "time_scale" in response.json()["error"]
    sim.control("reset", {"global": True})
    assert sim.http.get(f"{sim.url}/_control/standing", timeout=10).json()["time_scale"] == 1


def test_the_command_line_turns_the_model_on_and_sets_the_time_scale() -> None:
    url, process = start_simulator("--api-key", API_KEY, "--ban-model", "--time-scale", "500",
                                   env={"SIMULATOR_RABBITMQ_URL": "", "EVOLUTION_RABBITMQ_URL": ""})
    try:
        config = requests.get(f"{url}/_control/global", timeout=5).json()
        assert (config["ban_model"]["enabled"], config["time_scale"]) == (True, 500)
        requests.post(f"{url}/_control/instances/cli", json={"ban_model": {"min_gap_s": 1e9}}, timeout=5)
        for number in ("5511900000001", "5511900000002"):
            requests.post(f"{url}/message/sendText/cli", json={"number": number, "text": "x"},
                          headers={"apikey": API_KEY}, timeout=5)
        assert [s["wa_outcome"] for s in requests.get(f"{url}/_control/sends", timeout=5).json()] == [
            "accepted", "463"]
        requests.post(f"{url}/_control/reset", json={"global": True}, timeout=5)
        config = requests.get(f"{url}/_control/global", timeout=5).json()
        assert (config["ban_model"]["enabled"], config["time_scale"]) == (True, 500)  # the start-up values
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


def test_never_acknowledged_sends_stay_pending_on_a_connected_number(
        sim: Simulator, receiver: Receiver, inst: Json) -> None:
    sim.instance("my-instance", webhook={"url": receiver.url + "/hook", "events": []},
                 faults={"never_ack_rate": 1})
    answer = _send(sim, "5511900000001").json()
    assert answer["status"] == "PENDING"
    assert receiver.wait(1)[0]["event"] == "send.message"
    time.sleep(0.2)
    assert len(receiver.bodies()) == 1
    assert sim.post("/chat/findStatusMessage/my-instance", {"where": {"id": answer["key"]["id"]}}).json() == []
    assert sim.get("/instance/connectionState/my-instance").json()["instance"]["state"] == "open"
    assert _outcomes(sim) == ["unacknowledged"]
    sim.instance("my-instance", faults={"never_ack_rate": 0})
    _send(sim, "5511900000001")
    assert _outcomes(sim)[-1] == "accepted"


@pytest.mark.parametrize("ban_model, field", [
    ({"max_in_flight": 0}, "max_in_flight"),
    ({"min_gap_s": -1}, "min_gap_s"),
    ({"rate_limits": [{"window_s": 0, "max": 1}]}, "rate_limits"),
    ({"rate_limits": [{"window_s": 60}]}, "rate_limits"),
    ({"warmup_start": 0}, "warmup_start"),
    ({"enabled": "yes"}, "enabled"),
    ({"disconnect_s": "soon"}, "disconnect_s"),
    ({"strikes": 3}, "strikes"),
    ("on", "ban_model"),
])
def test_bad_ban_model_settings_are_400_and_change_nothing(sim: Simulator, inst: Json, ban_model: Any,
                                                           field: str) -> None:
    for path in ("instances/my-instance", "global"):
        response = sim.http.post(f"{sim.url}/_control/{path}", json={"ban_model": ban_model}, timeout=10)
        assert response.status_code == 400 and field in response.json()["error"]
    assert sim.http.get(f"{sim.url}/_control/instances/my-instance", timeout=10).json()["ban_model"] == {}
    assert sim.http.get(f"{sim.url}/_control/global", timeout=10).json()["ban_model"]["max_in_flight"] == 3


def test_reset_forgets_every_standing(sim: Simulator, inst: Json) -> None:
    _strict(sim, cold_max=1)
    _send(sim, "5511900000001")
    _send(sim, "5511900000002")
    assert _standing(sim)["strikes"] == 1
    sim.control("reset")
    assert sim.http.get(f"{sim.url}/_control/standing", timeout=10).json()["instances"] == {}
