"""sendText's `messageId`: the caller's WhatsApp id, honoured by default, ignored by an older Evolution;
its look-ups (findMessages where.key.id, findStatusMessage where.id) and GET /baileys/generateMessageID."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from .conftest import API_KEY, Json, Receiver, Simulator, sample, shape, wait_for

OURS = "3EB0AAAABBBBCCCCDDDD01"
ACKS = ["SERVER_ACK", "DELIVERY_ACK", "READ"]


def _hook(sim: Simulator, receiver: Receiver) -> None:
    # Receipts 40 ms apart: webhooks are posted concurrently, so events close in time may swap.
    sim.instance("my-instance", webhook={"url": receiver.url + "/hook", "events": []},
                 faults={"ack_delays_ms": {"SERVER_ACK": 40, "DELIVERY_ACK": 40, "READ": 40}})


def _find(sim: Simulator, where: Json) -> Any:
    response = sim.post("/chat/findMessages/my-instance", {"where": where})
    assert response.status_code == 200, response.text
    return response.json()["messages"]


def _statuses(sim: Simulator, key_id: str) -> list[str]:
    rows = sim.post("/chat/findStatusMessage/my-instance", {"where": {"id": key_id}}).json()
    return [row["status"] for row in rows]


def test_the_id_asked_for_is_the_id_everywhere(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver)
    response = sim.send_text("my-instance", messageId=OURS)
    assert response.status_code == 201
    answer = response.json()
    assert answer["key"]["id"] == OURS and answer["source"] == "web"
    assert shape(answer) == shape(sample("sendText.response.201.json"))
    bodies = receiver.wait(4)
    assert [(b["event"], b["data"].get("status")) for b in bodies] == [
        ("send.message", "PENDING"), ("messages.update", "SERVER_ACK"), ("messages.update", "DELIVERY_ACK"),
        ("messages.update", "READ")]
    assert bodies[0]["data"]["key"]["id"] == OURS
    assert {b["data"]["keyId"] for b in bodies[1:]} == {OURS}
    found = _find(sim, {"key": {"id": OURS}})
    assert found["total"] == 1 and found["records"][0]["key"] == answer["key"]
    assert [u["status"] for u in found["records"][0]["MessageUpdate"]] == ACKS
    assert _statuses(sim, OURS) == ACKS
    logged = sim.sends(instance="my-instance")[0]
    assert (logged["message_id"], logged["id"], logged["id_reused"], logged["wa_outcome"]) == (
        OURS, OURS, None, "accepted")


def test_find_messages_by_key_id_is_exact(sim: Simulator, inst: Json) -> None:
    sim.send_text("my-instance", messageId=OURS)
    sim.send_text("my-instance", text="another")
    for other in (OURS.lower(), OURS[:-1], OURS + "0"):
        assert _find(sim, {"key": {"id": other}})["total"] == 0
    # Combined with other key fields, as Evolution ANDs them.
    assert _find(sim, {"key": {"id": OURS, "remoteJid": "5511999999999@s.whatsapp.net"}})["total"] == 1
    assert _find(sim, {"key": {"id": OURS, "remoteJid": "5511900000000@s.whatsapp.net"}})["total"] == 0
    assert _find(sim, {"key": {"id": OURS, "fromMe": True}})["total"] == 1


def test_a_false_from_me_filters_nothing_like_evolution(sim: Simulator, inst: Json) -> None:
    # fetchMessages adds a key condition only for a truthy value.
    sim.send_text("my-instance", messageId=OURS)
    assert _find(sim, {"key": {"id": OURS, "fromMe": False}})["total"] == 1
    assert _find(sim, {"key": {"fromMe": False}})["total"] == 1


def test_remote_jid_alt_finds_a_lid_chat_by_its_phone(sim: Simulator, inst: Json) -> None:
    sim.instance("my-instance", lids={"5511999999999": "123456789012345@lid"})
    sim.send_text("my-instance", messageId=OURS)
    assert _find(sim, {"key": {"remoteJid": "5511999999999@s.whatsapp.net"}})["total"] == 0
    assert _find(sim, {"key": {"remoteJidAlt": "5511999999999@s.whatsapp.net"}})["total"] == 1
    assert _find(sim, {"key": {"remoteJid": "x@s.whatsapp.net",
                               "remoteJidAlt": "5511999999999@s.whatsapp.net"}})["total"] == 1


def test_an_older_evolution_ignores_the_field(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    config = sim.instance("my-instance", ignore_message_id=True)
    assert config["ignore_message_id"] is True
    _hook(sim, receiver)
    answer = sim.send_text("my-instance", messageId=OURS).json()
    assert answer["key"]["id"] != OURS and re.fullmatch(r"3EB0[0-9A-F]{18}", answer["key"]["id"])
    assert receiver.wait(1)[0]["data"]["key"]["id"] == answer["key"]["id"]
    assert _find(sim, {"key": {"id": OURS}})["total"] == 0
    assert _find(sim, {"key": {"id": answer["key"]["id"]}})["total"] == 1
    logged = sim.sends()[0]
    assert (logged["message_id"], logged["id"]) == (OURS, answer["key"]["id"])
    # Nor does it know the route that makes ids.
    response = sim.get("/baileys/generateMessageID/my-instance")
    assert response.status_code == 404
    assert response.json()["response"]["message"] == ["Cannot GET /baileys/generateMessageID/my-instance"]
    sim.instance("my-instance", ignore_message_id=False)
    assert sim.send_text("my-instance", messageId=OURS).json()["key"]["id"] == OURS


@pytest.mark.parametrize("falsy", [None, "", 0, False])
def test_a_falsy_message_id_gets_a_generated_one(sim: Simulator, inst: Json, falsy: Any) -> None:
    answer = sim.send_text("my-instance", messageId=falsy).json()
    assert re.fullmatch(r"3EB0[0-9A-F]{18}", answer["key"]["id"]) and answer["source"] == "web"


@pytest.mark.parametrize("key_id, source", [
    ("A5F1D3C2B4E6F7081928374655647382", "android"),  # 32 characters: Baileys' getDevice says android
    ("3A1234567890ABCDEF12", "ios"),
    ("3F1234567890ABCDEF12", "desktop"),
    ("3eb0aaaabbbbccccdddd01", "unknown"),  # lower case: not WhatsApp Web's format
    ("our-own id with spaces", "unknown"),
])
def test_any_string_is_used_as_given_and_its_format_sets_the_source(sim: Simulator, inst: Json, key_id: str,
                                                                    source: str) -> None:
    answer = sim.send_text("my-instance", messageId=key_id).json()
    assert (answer["key"]["id"], answer["source"]) == (key_id, source)
    assert _find(sim, {"key": {"id": key_id}})["records"][0]["source"] == source
    wait_for(lambda: _statuses(sim, key_id) == ACKS)


def test_an_id_longer_than_evolutions_column_gets_events_but_no_status_rows(
        sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver)
    long_id = "3EB0" + "A" * 97  # 101 characters: MessageUpdate.keyId is VARCHAR(100)
    assert sim.send_text("my-instance", messageId=long_id).json()["key"]["id"] == long_id
    assert [b["data"].get("status") for b in receiver.wait(4)] == ["PENDING", *ACKS]
    assert _statuses(sim, long_id) == []
    assert _find(sim, {"key": {"id": long_id}})["records"][0]["MessageUpdate"] == []


def test_a_non_string_id_is_accepted_and_never_acknowledged(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver)
    response = sim.send_text("my-instance", messageId=12345)
    assert response.status_code == 201
    answer = response.json()
    assert (answer["key"]["id"], answer["status"], answer["source"]) == (12345, "PENDING", "unknown")
    assert receiver.wait(1)[0]["event"] == "send.message"
    wait_for(lambda: sim.sends()[0]["wa_outcome"] == "unacknowledged")
    assert _find(sim, {"key": {"id": "12345"}})["total"] == 0
    time.sleep(0.2)
    assert [b["event"] for b in receiver.bodies()] == ["send.message"]
    assert sim.get("/instance/connectionState/my-instance").json()["instance"]["state"] == "open"


def test_the_same_id_again_in_the_same_chat_is_a_second_row(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    first = sim.send_text("my-instance", messageId=OURS).json()
    wait_for(lambda: _statuses(sim, OURS) == ACKS)
    _hook(sim, receiver)
    second = sim.send_text("my-instance", messageId=OURS, text="again").json()
    assert second["key"] == first["key"]
    receipts = receiver.wait(4)[1:]
    found = _find(sim, {"key": {"id": OURS}})
    assert found["total"] == 2
    newest, oldest = found["records"]
    assert newest["message"]["conversation"] == "again"
    # Evolution files every receipt of that id under the first row it finds (LIMIT 1).
    assert newest["MessageUpdate"] == [] and [u["status"] for u in oldest["MessageUpdate"]] == ACKS * 2
    assert {r["data"]["messageId"] for r in receipts} == {oldest["id"]}
    assert [s["id_reused"] for s in sim.sends()] == [None, "same_chat"]


def test_the_same_id_in_another_chat_mixes_up_evolutions_receipts(
        sim: Simulator, receiver: Receiver, inst: Json) -> None:
    sim.send_text("my-instance", messageId=OURS, number="5511999999999")
    wait_for(lambda: _statuses(sim, OURS) == ACKS)
    _hook(sim, receiver)
    other = sim.send_text("my-instance", messageId=OURS, number="5511977776666").json()
    assert other["key"]["remoteJid"] == "5511977776666@s.whatsapp.net"
    receipts = receiver.wait(4)[1:]
    # The receipts of the second message carry the first message's chat and row.
    assert {r["data"]["remoteJid"] for r in receipts} == {"5511999999999@s.whatsapp.net"}
    found = _find(sim, {"key": {"id": OURS}})
    assert sorted(r["key"]["remoteJid"] for r in found["records"]) == [
        "5511977776666@s.whatsapp.net", "5511999999999@s.whatsapp.net"]
    assert _find(sim, {"key": {"id": OURS, "remoteJid": "5511977776666@s.whatsapp.net"}})["total"] == 1
    assert [s["id_reused"] for s in sim.sends()] == [None, "other_chat"]


def test_generate_message_id_answers_an_id_in_whatsapp_webs_format(sim: Simulator, inst: Json) -> None:
    response = sim.get("/baileys/generateMessageID/my-instance")
    assert response.status_code == 200
    assert set(response.json()) == {"id"} and re.fullmatch(r"3EB0[0-9A-F]{18}", response.json()["id"])
    assert sim.get("/baileys/generateMessageID/my-instance", key=inst["token"]).status_code == 200
    assert sim.get("/baileys/generateMessageID/my-instance", key="wrong").status_code == 401
    assert sim.get("/baileys/generateMessageID/nope", key=None).status_code == 404
    assert sim.post("/baileys/generateMessageID/my-instance", {}).json()["response"]["message"] == [
        "Cannot POST /baileys/generateMessageID/my-instance"]
    sim.instance("my-instance", loaded=False)
    assert sim.get("/baileys/generateMessageID/my-instance", key=API_KEY).status_code == 500
