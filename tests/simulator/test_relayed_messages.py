"""POST /_control/instances/{name}/messages: a message Evolution receives without having sent it, typed on
the account's phone (a twin of ours) or written by the contact."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from .conftest import Json, Receiver, Simulator, sample, shape, wait_for

NUMBER = "5511999999999"
JID = "5511999999999@s.whatsapp.net"
AT = 1761057639


def _relay(sim: Simulator, **body: Any) -> Any:
    response = sim.http.post(f"{sim.url}/_control/instances/my-instance/messages", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def _hook(sim: Simulator, receiver: Receiver) -> None:
    sim.instance("my-instance", webhook={"url": receiver.url + "/hook", "events": []},
                 faults={"ack_delays_ms": {"SERVER_ACK": 40, "DELIVERY_ACK": 40, "READ": 40}})


def _find(sim: Simulator, where: Json) -> Any:
    return sim.post("/chat/findMessages/my-instance", {"where": where}).json()["messages"]


def test_a_phone_typed_twin_is_found_like_ours_but_from_the_phone(
        sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver)
    ours = sim.send_text("my-instance", text="Ok", messageId="3EB0AAAABBBBCCCCDDDD01").json()
    receiver.wait(4)
    receiver.clear()
    twin = _relay(sim, number="+55 11 99999-9999", text="Ok", at=ours["messageTimestamp"])
    assert twin["key"]["fromMe"] is True and twin["key"]["remoteJid"] == JID
    assert re.fullmatch(r"[0-9A-F]{32}", twin["key"]["id"]) and twin["source"] == "android"
    assert twin["messageTimestamp"] == ours["messageTimestamp"] and twin["message"] == {"conversation": "Ok"}
    # Same number, same text, same second: only the id and the source tell them apart.
    window = {"key": {"remoteJid": JID, "fromMe": True},
              "messageTimestamp": {"gte": "2020-01-01T00:00:00Z", "lte": "2100-01-01T00:00:00Z"}}
    records = _find(sim, window)["records"]
    assert sorted(r["source"] for r in records) == ["android", "web"]
    assert {r["message"]["conversation"] for r in records} == {"Ok"}
    assert [r["key"]["id"] for r in _find(sim, {"key": {"id": ours["key"]["id"]}})["records"]] == [ours["key"]["id"]]
    # Evolution gets it as messages.upsert (fromMe), never as send.message; then the contact's receipts.
    bodies = receiver.wait(3)
    upsert = bodies[0]
    assert upsert["event"] == "messages.upsert"
    assert upsert["data"]["key"] == twin["key"] and upsert["data"]["status"] == "SERVER_ACK"
    assert (upsert["data"]["source"], upsert["data"]["messageTimestamp"]) == ("android", ours["messageTimestamp"])
    assert shape(upsert["data"]) == shape(sample("webhook.messages.upsert.inbound-text.json")["data"])
    assert [(b["event"], b["data"]["status"]) for b in bodies[1:]] == [
        ("messages.update", "DELIVERY_ACK"), ("messages.update", "READ")]
    assert {b["data"]["keyId"] for b in bodies[1:]} == {twin["key"]["id"]}
    time.sleep(0.15)
    assert "send.message" not in {b["event"] for b in receiver.bodies()}
    assert [s["id"] for s in sim.sends()] == [ours["key"]["id"]]  # the twin was no sendText


@pytest.mark.parametrize("device, pattern", [
    ("ios", r"3A[0-9A-F]{18}"), ("android", r"[0-9A-F]{32}"), ("desktop", r"3F[0-9A-F]{18}"),
    ("web", r"3EB0[0-9A-F]{18}"),  # WhatsApp Web, or another integration linked to the number
])
def test_each_device_writes_ids_of_its_own_format(sim: Simulator, inst: Json, device: str, pattern: str) -> None:
    twin = _relay(sim, number=NUMBER, text="Olá", device=device, at="2025-10-21T14:40:39Z")
    assert re.fullmatch(pattern, twin["key"]["id"]) and twin["source"] == device
    assert twin["messageTimestamp"] == AT


def test_a_twin_can_carry_a_given_id(sim: Simulator, inst: Json) -> None:
    twin = _relay(sim, number=NUMBER, text="Ok", id="3A0000000000000000AB", device="ios")
    assert _find(sim, {"key": {"id": "3A0000000000000000AB"}})["records"][0]["id"] == twin["id"]


def test_a_message_from_the_contact_is_an_inbound_upsert(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver)
    record = _relay(sim, number=NUMBER, text="Sim, confirmo!", from_me=False, push_name="Maria Silva", at=AT)
    body = receiver.wait(1)[0]
    expected = sample("webhook.messages.upsert.inbound-text.json")
    assert shape(body) == shape(expected)
    data = body["data"]
    assert (data["key"]["fromMe"], data["status"], data["pushName"], data["source"]) == (
        False, "DELIVERY_ACK", "Maria Silva", "android")
    assert data["key"] == record["key"] and data["messageTimestamp"] == AT
    assert record["MessageUpdate"] == [] and record["contextInfo"] is None
    time.sleep(0.15)
    assert len(receiver.bodies()) == 1  # no receipts for a message we received


def test_a_lid_contacts_message_is_stored_under_the_lid_and_announced_by_phone(
        sim: Simulator, receiver: Receiver, inst: Json) -> None:
    sim.instance("my-instance", lids={NUMBER: "123456789012345@lid"})
    _hook(sim, receiver)
    record = _relay(sim, number=NUMBER, text="Oi", from_me=False)
    assert record["key"]["remoteJid"] == "123456789012345@lid" and record["key"]["remoteJidAlt"] == JID
    key = receiver.wait(1)[0]["data"]["key"]
    assert (key["remoteJid"], key["remoteJidAlt"], key["addressingMode"]) == (JID, "123456789012345@lid", "pn")


@pytest.mark.parametrize("body, field", [
    ({"text": "x"}, "number"),
    ({"number": "abc", "text": "x"}, "number"),
    ({"number": NUMBER, "text": "  "}, "text"),
    ({"number": NUMBER, "text": "x", "device": "pager"}, "device"),
    ({"number": NUMBER, "text": "x", "from_me": "yes"}, "from_me"),
    ({"number": NUMBER, "text": "x", "at": "yesterday"}, "at"),
    ({"number": NUMBER, "text": "x", "at": -5}, "at"),
    ({"number": NUMBER, "text": "x", "id": "x" * 101}, "id"),
    ({"number": NUMBER, "text": "x", "colour": "red"}, "colour"),
    ({"number": "5511900000000", "text": "x"}, "not a contact"),
])
def test_bad_input_is_400_and_stores_nothing(sim: Simulator, inst: Json, body: Json, field: str) -> None:
    sim.instance("my-instance", faults={"not_on_whatsapp": ["5511900000000"]})
    response = sim.http.post(f"{sim.url}/_control/instances/my-instance/messages", json=body, timeout=10)
    assert response.status_code == 400 and field in response.json()["error"]
    assert _find(sim, {})["total"] == 0


def test_an_unknown_instance_is_404(sim: Simulator) -> None:
    response = sim.http.post(f"{sim.url}/_control/instances/nope/messages", json={"number": NUMBER, "text": "x"})
    assert response.status_code == 404


def test_receipts_of_a_twin_follow_the_instance_plan(sim: Simulator, inst: Json) -> None:
    sim.instance("my-instance", faults={"ack_delays_ms": {"READ": None}})
    twin = _relay(sim, number=NUMBER, text="Ok")

    def rows() -> Any:
        return sim.post("/chat/findStatusMessage/my-instance", {"where": {"id": twin["key"]["id"]}}).json()

    found = wait_for(lambda: rows())
    time.sleep(0.1)
    assert [(r["status"], r["fromMe"], r["keyId"]) for r in rows()] == [("DELIVERY_ACK", True, twin["key"]["id"])]
    assert found[0]["messageId"] == twin["id"]
