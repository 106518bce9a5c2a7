"""Instance routes: connectionState, fetchInstances, create, delete, GET /."""

from __future__ import annotations

import re

from .conftest import Json, API_KEY, Receiver, Simulator, sample, shape


def test_root_needs_no_auth(sim: Simulator) -> None:
    body = sim.get("/", key=None).json()
    assert body["status"] == 200 and body["message"] == "Welcome to the Evolution API, it is working!"


def test_connection_state_matches_the_samples(sim: Simulator, inst: Json) -> None:
    for state in ("open", "connecting", "close"):
        sim.instance("my-instance", state=state)
        response = sim.get("/instance/connectionState/my-instance")
        assert response.status_code == 200
        assert response.json() == sample(f"connectionState.response.{state}.json")
    sim.instance("my-instance", loaded=False)
    assert sim.get("/instance/connectionState/my-instance").json() == sample("connectionState.response.not-loaded.json")


def test_connection_state_guards(sim: Simulator, inst: Json) -> None:
    assert sim.get("/instance/connectionState/unknown-instance", key=None).status_code == 404
    assert sim.get("/instance/connectionState/my-instance", key=None).status_code == 401
    assert sim.get("/instance/connectionState/my-instance", key=inst["token"]).status_code == 200


def test_fetch_instances_matches_the_sample(sim: Simulator, inst: Json) -> None:
    sim.post("/rabbitmq/set/my-instance", sample("rabbitmq.set.request.json"))
    sim.send_text("my-instance")
    sim.instance("another")
    rows = sim.get("/instance/fetchInstances?instanceName=my-instance").json()
    expected = sample("fetchInstances.response.json")
    assert shape(rows) == shape(expected)
    row = rows[0]
    assert (row["name"], row["connectionStatus"], row["ownerJid"], row["token"]) == (
        "my-instance", "open", "5511988887777@s.whatsapp.net", inst["token"])
    assert row["Rabbitmq"]["events"] == expected[0]["Rabbitmq"]["events"]
    assert row["_count"]["Message"] == 1


def test_fetch_instances_filters_by_key(sim: Simulator, inst: Json) -> None:
    sim.instance("another")
    assert sorted(r["name"] for r in sim.get("/instance/fetchInstances").json()) == ["another", "my-instance"]
    assert [r["name"] for r in sim.get("/instance/fetchInstances", key=inst["token"]).json()] == ["my-instance"]
    assert sim.get("/instance/fetchInstances", key="wrong").status_code == 401
    missing = sim.get("/instance/fetchInstances?instanceName=nope")
    assert missing.status_code == 404
    assert missing.json()["response"]["message"] == ['Instance "nope" not found']


def test_create_answers_201_with_hash_equal_to_token(sim: Simulator) -> None:
    response = sim.post("/instance/create", {"instanceName": "fresh", "token": "MY-TOKEN",
                                              "integration": "WHATSAPP-BAILEYS"})
    assert response.status_code == 201
    body = response.json()
    assert list(body) == ["instance", "hash", "webhook", "websocket", "rabbitmq", "nats", "sqs", "settings"]
    assert list(body["instance"]) == ["instanceName", "instanceId", "integration", "webhookWaBusiness",
                                      "accessTokenWaBusiness", "status"]
    assert body["hash"] == "MY-TOKEN" and body["instance"]["status"] == "close"
    generated = sim.post("/instance/create", {"instanceName": "fresh-2"}).json()["hash"]
    assert re.fullmatch(r"[0-9A-F]{8}-[0-9A-F]{4}-4[0-9A-F]{3}-[89AB][0-9A-F]{3}-[0-9A-F]{12}", generated)
    # A created instance is not connected until its QR code is scanned.
    assert sim.send_text("fresh", key="MY-TOKEN").status_code == 500


def test_create_guards(sim: Simulator, inst: Json) -> None:
    taken = sim.post("/instance/create", {"instanceName": "my-instance"}, key=None)
    assert taken.status_code == 403
    assert taken.json()["response"]["message"] == ['This name "my-instance" is already in use.']
    assert sim.post("/instance/create", {"instanceName": "x"}, key=inst["token"]).status_code == 401
    assert sim.post("/instance/create", {"instanceName": "x", "qrcode": "yes"}).json()["response"]["message"] == [
        ["qrcode is not of a type(s) boolean"]]


def test_create_with_qrcode_pairs_and_emits_connection_updates(sim: Simulator, receiver: Receiver) -> None:
    body = sim.post("/instance/create", {"instanceName": "paired", "qrcode": True,
                                          "webhook": {"url": receiver.url + "/hook", "events": ["CONNECTION_UPDATE"]}}).json()
    assert body["instance"]["status"] == "connecting" and "qrcode" in body
    assert body["webhook"] == {"webhookUrl": receiver.url + "/hook"}
    connecting, opened = receiver.wait(2)
    assert shape(connecting) == shape(sample("webhook.connection.update.connecting.json"))  # no sender yet
    assert shape(opened) == shape(sample("webhook.connection.update.open.json"))
    assert sim.get("/instance/connectionState/paired").json()["instance"]["state"] == "open"


def test_delete_marks_the_instance_deleted(sim: Simulator, inst: Json) -> None:
    assert sim.call("DELETE", "/instance/delete/my-instance", key=None).status_code == 401
    response = sim.call("DELETE", "/instance/delete/my-instance")
    assert response.status_code == 200
    assert response.json() == {"status": "SUCCESS", "error": False, "response": {"message": "Instance deleted"}}
    assert sim.get("/instance/connectionState/my-instance").status_code == 404
    assert sim.get("/instance/fetchInstances").json() == []
    assert sim.post("/instance/create", {"instanceName": "my-instance"}, key=API_KEY).status_code == 201


def test_root_answers_the_status_it_is_told_to(sim: Simulator) -> None:
    # A gateway behind a proxy with a path prefix, or another version, does not answer GET / with the welcome.
    assert sim.http.post(f"{sim.url}/_control/global", json={"root_status": 404}).status_code == 200
    response = sim.get("/", key=None)
    assert response.status_code == 404 and response.json()["response"]["message"] == ["Cannot GET /"]
    assert sim.http.post(f"{sim.url}/_control/global", json={"root_status": 200}).status_code == 200
    assert sim.get("/", key=None).status_code == 200
    for bad in (99, 600, "404", True):
        assert sim.http.post(f"{sim.url}/_control/global", json={"root_status": bad}).status_code == 400
