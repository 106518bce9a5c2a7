"""POST /message/sendText/{instance}: every answer checked against Evolution's sample bodies (tests/simulator/samples)."""

from __future__ import annotations

import re
import time

from .conftest import Json, API_KEY, Simulator, sample, shape


def test_it_answers_201_with_the_sample_shape(sim: Simulator, inst: Json) -> None:
    before = int(time.time())
    response = sim.post("/message/sendText/my-instance", sample("sendText.request.minimal.json"))
    assert response.status_code == 201
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    body = response.json()
    expected = sample("sendText.response.201.json")
    assert shape(body) == shape(expected)
    assert body["key"]["remoteJid"] == "5511999999999@s.whatsapp.net"
    assert body["key"]["fromMe"] is True
    assert re.fullmatch(r"3EB0[0-9A-F]{18}", body["key"]["id"])
    assert (body["pushName"], body["status"], body["messageType"], body["source"]) == ("Você", "PENDING", "conversation", "web")
    assert body["message"] == {"conversation": "Olá! Seu pedido #123 foi confirmado."}
    assert body["instanceId"] == inst["id"]
    assert before <= body["messageTimestamp"] <= int(time.time())


def test_it_accepts_the_instance_token_and_the_full_request(sim: Simulator, inst: Json) -> None:
    response = sim.post("/message/sendText/my-instance", sample("sendText.request.json") | {"delay": 0},
                        key=inst["token"])
    assert response.status_code == 201


def test_it_strips_plus_spaces_parentheses_and_dashes(sim: Simulator, inst: Json) -> None:
    body = sim.send_text("my-instance", number="+55 (11) 99999-9999").json()
    assert body["key"]["remoteJid"] == "5511999999999@s.whatsapp.net"


def test_it_applies_the_brazil_ninth_digit_rule(sim: Simulator, inst: Json) -> None:
    # DDD >= 31 mobiles: WhatsApp's jid has no 9th digit (Evolution createJid).
    body = sim.send_text("my-instance", number="5531999999999").json()
    assert body["key"]["remoteJid"] == "553199999999@s.whatsapp.net"


def test_unknown_instance_is_404_before_auth(sim: Simulator) -> None:
    for key in (None, "wrong", API_KEY):
        response = sim.send_text("unknown-instance", key=key)
        assert response.status_code == 404
        assert response.json() == sample("error.404.instance-not-found.json")


def test_wrong_or_missing_key_is_401(sim: Simulator, inst: Json) -> None:
    for key in (None, "wrong"):
        response = sim.send_text("my-instance", key=key)
        assert response.status_code == 401
        assert response.json() == sample("error.401.unauthorized.json")
    other = sim.instance("other-instance")
    assert sim.send_text("my-instance", key=other["token"]).status_code == 401


def test_schema_errors_are_a_nested_array(sim: Simulator, inst: Json) -> None:
    response = sim.post("/message/sendText/my-instance", {"number": "5511999999999"})
    assert response.status_code == 400
    assert response.json() == sample("error.400.validation-missing-text.json")
    response = sim.post("/message/sendText/my-instance", {"number": 5511999999999, "text": "x", "delay": 1.5})
    assert response.json()["response"]["message"] == [["Invalid format", "Enter a value in milliseconds"]]
    response = sim.post("/message/sendText/my-instance", {"textMessage": {"text": "v1 shape"}})
    assert response.json()["response"]["message"] == [
        ['instance requires property "number"', 'instance requires property "text"']]


def test_blank_text_is_required(sim: Simulator, inst: Json) -> None:
    for text in ("", "   "):
        response = sim.send_text("my-instance", text=text)
        assert response.status_code == 400
        assert response.json() == sample("error.400.text-required.json")


def test_malformed_json_is_400_even_for_an_unknown_instance(sim: Simulator) -> None:
    response = sim.post("/message/sendText/unknown-instance", raw=b'{"number":}')
    assert response.status_code == 400
    assert response.json() == sample("error.400.malformed-json.json")


def test_unknown_route_is_404(sim: Simulator, inst: Json) -> None:
    response = sim.post("/message/sendTxt/my-instance", {})
    assert response.status_code == 404
    assert response.json() == sample("error.404.unknown-route.json")
    assert sim.call("PUT", "/message/sendText/my-instance").json()["response"]["message"] == [
        "Cannot PUT /message/sendText/my-instance"]


def test_number_not_on_whatsapp_is_400_and_sends_nothing(sim: Simulator, inst: Json) -> None:
    sim.instance("my-instance", faults={"not_on_whatsapp": ["+5511900000000"]})
    response = sim.send_text("my-instance", number="5511900000000")
    assert response.status_code == 400
    assert response.json() == sample("error.400.number-not-on-whatsapp.json")
    assert sim.control("instances/my-instance", {})["name"] == "my-instance"
    assert sim.http.get(f"{sim.url}/_control/instances/my-instance").json()["counters"]["stored_messages"] == 0


def test_disconnected_instance_is_500_connection_closed(sim: Simulator, inst: Json) -> None:
    for state in ("close", "connecting"):
        sim.instance("my-instance", state=state)
        response = sim.send_text("my-instance")
        assert response.status_code == 500
        assert response.json() == sample("error.500.connection-closed.json")


def test_disconnected_with_cached_number_is_400(sim: Simulator, inst: Json) -> None:
    sim.instance("my-instance", state="close", faults={"number_cached": True})
    response = sim.send_text("my-instance")
    assert response.status_code == 400
    assert response.json() == sample("error.400.connection-closed-number-cached.json")


def test_instance_not_loaded_is_500(sim: Simulator, inst: Json) -> None:
    sim.instance("my-instance", loaded=False)
    response = sim.send_text("my-instance")
    assert response.status_code == 500
    assert response.json() == sample("error.500.instance-not-loaded.json")


def test_deleted_instance_is_404(sim: Simulator, inst: Json) -> None:
    assert sim.call("DELETE", "/instance/delete/my-instance").status_code == 200
    response = sim.send_text("my-instance", key=None)
    assert response.status_code == 404
    assert response.json()["response"]["message"] == ['The "my-instance" instance does not exist']


def test_delay_blocks_the_answer(sim: Simulator, inst: Json) -> None:
    started = time.monotonic()
    assert sim.send_text("my-instance", delay=400).status_code == 201
    assert time.monotonic() - started >= 0.4


def test_every_request_is_logged_with_its_answer(sim: Simulator, inst: Json) -> None:
    created = sim.send_text("my-instance", number="+55 11 99999-9999").json()
    sim.send_text("my-instance", key="wrong")
    sends = sim.sends(instance="my-instance")
    assert [(s["status"], s["id"]) for s in sends] == [(201, created["key"]["id"]), (401, None)]
    assert sends[0]["number"] == "+55 11 99999-9999" and sends[0]["text"] == "Olá! Seu pedido #123 foi confirmado."
    assert [s["status"] for s in sim.sends(number="5511999999999")] == [201, 401]
    assert sim.stats()["send_text"] == {"total": 2, "by_status": {"201": 1, "401": 1}, "in_flight": 0, "max_in_flight": 1}
