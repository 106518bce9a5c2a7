"""Chat routes and per-instance event settings, checked against Evolution's sample bodies (tests/simulator/samples)."""

from __future__ import annotations

import time
from typing import Any

from .conftest import Json, Simulator, sample, shape, wait_for


def _sent(sim: Simulator) -> Any:
    return sim.send_text("my-instance").json()


def test_find_status_message_lists_one_row_per_receipt(sim: Simulator, inst: Json) -> None:
    sent = _sent(sim)
    query = sample("findStatusMessage.request.json")
    query["where"]["id"] = sent["key"]["id"]

    def rows() -> Any:
        return sim.post("/chat/findStatusMessage/my-instance", query).json()

    found = wait_for(lambda: len(rows()) == 3 and rows())
    assert shape(found) == shape(sample("findStatusMessage.response.json"))
    assert [r["status"] for r in found] == ["SERVER_ACK", "DELIVERY_ACK", "READ"]
    assert {r["keyId"] for r in found} == {sent["key"]["id"]}
    assert len({r["messageId"] for r in found}) == 1 and found[0]["messageId"].startswith("c")
    assert all(len(r["id"]) == 25 and r["id"].startswith("c") for r in found)
    query["where"]["remoteJid"] = "5511999999999"  # exact match only, no normalising
    assert rows() == []


def test_find_status_message_is_empty_before_receipts(sim: Simulator, inst: Json) -> None:
    sim.instance("my-instance", faults={"ack_delays_ms": {"SERVER_ACK": None, "DELIVERY_ACK": None, "READ": None}})
    sent = _sent(sim)
    time.sleep(0.1)
    response = sim.post("/chat/findStatusMessage/my-instance", {"where": {"id": sent["key"]["id"]}})
    assert response.status_code == 200 and response.json() == []


def test_find_messages_matches_the_sample(sim: Simulator, inst: Json) -> None:
    sent = _sent(sim)
    wait_for(lambda: len(sim.post("/chat/findStatusMessage/my-instance", {"where": {"id": sent["key"]["id"]}}).json()) == 3)
    query = sample("findMessages.request.json")
    query["where"]["key"]["id"] = sent["key"]["id"]
    body = sim.post("/chat/findMessages/my-instance", query).json()
    assert shape(body) == shape(sample("findMessages.response.json"))
    record = body["messages"]["records"][0]
    assert record["key"] == sent["key"] and "status" not in record
    assert record["MessageUpdate"] == [{"status": "SERVER_ACK"}, {"status": "DELIVERY_ACK"}, {"status": "READ"}]


def test_find_messages_pages_newest_first(sim: Simulator, inst: Json) -> None:
    ids = [_sent(sim)["key"]["id"] for _ in range(3)]
    body = sim.post("/chat/findMessages/my-instance", {"page": 1, "offset": 2}).json()["messages"]
    assert (body["total"], body["pages"], body["currentPage"]) == (3, 2, 1)
    assert [r["key"]["id"] for r in body["records"]] == ids[::-1][:2]


def test_whatsapp_numbers_matches_the_sample(sim: Simulator, inst: Json) -> None:
    sim.instance("my-instance", faults={"not_on_whatsapp": ["5511900000000"]})
    response = sim.post("/chat/whatsappNumbers/my-instance", sample("whatsappNumbers.request.json"))
    assert response.status_code == 200
    expected = sample("whatsappNumbers.response.json")
    del expected[0]["name"]  # the contact's push name: unknown to the simulator, omitted like undefined
    assert response.json() == expected


def test_whatsapp_numbers_answers_raw_errors(sim: Simulator, inst: Json) -> None:
    response = sim.post("/chat/whatsappNumbers/my-instance", {"numbers": []})
    assert response.status_code == 400
    assert response.json() == {"status": 400, "error": "Bad Request",
                               "message": [["numbers does not meet minimum length of 1"]]}
    sim.instance("my-instance", state="close")
    assert sim.post("/chat/whatsappNumbers/my-instance", {"numbers": ["5511999999999"]}).status_code == 400


def test_send_presence_blocks_for_its_delay(sim: Simulator, inst: Json) -> None:
    request = sample("sendPresence.request.json") | {"delay": 300}
    started = time.monotonic()
    response = sim.post("/chat/sendPresence/my-instance", request)
    assert time.monotonic() - started >= 0.3
    assert response.status_code == 201
    assert response.json() == sample("sendPresence.response.201.json")
    missing = sim.post("/chat/sendPresence/my-instance", {"number": "5511999999999"})
    assert missing.json()["response"]["message"] == [
        ['instance requires property "presence"', 'instance requires property "delay"']]


def test_webhook_set_and_find(sim: Simulator, inst: Json) -> None:
    assert sim.get("/webhook/find/my-instance").json() is None
    response = sim.post("/webhook/set/my-instance", sample("webhook.set.request.json"))
    assert response.status_code == 201
    row = response.json()
    assert list(row) == ["id", "url", "headers", "enabled", "events", "webhookByEvents", "webhookBase64",
                         "createdAt", "updatedAt", "instanceId"]
    assert row["events"] == sample("webhook.set.request.json")["webhook"]["events"]
    assert row["headers"] == {"X-Shared-Secret": "change-me"} and row["instanceId"] == inst["id"]
    assert sim.get("/webhook/find/my-instance").json() == row
    bad = sim.post("/webhook/set/my-instance", {"webhook": {"enabled": True, "url": "x", "events": ["NOPE"]}})
    assert bad.status_code == 400 and bad.json()["response"]["message"][0][0].startswith(
        "webhook.events[0] is not one of enum values: APPLICATION_STARTUP,")


def test_webhook_set_with_no_events_stores_all(sim: Simulator, inst: Json) -> None:
    row = sim.post("/webhook/set/my-instance", {"webhook": {"enabled": True, "url": "http://x.test/h"}}).json()
    assert "MESSAGES_UPDATE" in row["events"] and len(row["events"]) == 27


def test_rabbitmq_set_returns_the_row(sim: Simulator, inst: Json) -> None:
    response = sim.post("/rabbitmq/set/my-instance", sample("rabbitmq.set.request.json"))
    assert response.status_code == 201
    row = response.json()
    assert shape(row) == shape(sample("fetchInstances.response.json")[0]["Rabbitmq"])
    assert row["events"] == ["MESSAGES_UPDATE", "SEND_MESSAGE", "CONNECTION_UPDATE"]
