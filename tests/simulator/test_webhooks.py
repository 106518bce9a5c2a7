"""Webhook emission: order, envelope, by-events, global, headers/JWT, retries, drop/duplicate."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt

from .conftest import Json, Receiver, Simulator, sample, shape, wait_for

JWT_KEY = "a-shared-secret-of-at-least-32-bytes!"
ENVELOPE_KEYS = ["event", "instance", "data", "destination", "date_time", "sender", "server_url", "apikey"]


def _hook(sim: Simulator, receiver: Receiver, **webhook: object) -> str:
    url = receiver.url + "/hook"
    sim.instance("my-instance", webhook={"enabled": True, "url": url, "events": [], **webhook})
    return url


def test_events_arrive_in_order_with_the_sample_envelopes(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    request = sample("webhook.set.request.json")
    request["webhook"]["url"] = receiver.url + "/hook"
    assert sim.post("/webhook/set/my-instance", request).status_code == 201
    sim.instance("my-instance", faults={"ack_delays_ms": {"SERVER_ACK": 40, "DELIVERY_ACK": 40, "READ": 40}})
    sent = sim.send_text("my-instance").json()
    bodies = receiver.wait(4)
    assert [(b["event"], b["data"].get("status")) for b in bodies] == [
        ("send.message", "PENDING"), ("messages.update", "SERVER_ACK"),
        ("messages.update", "DELIVERY_ACK"), ("messages.update", "READ")]
    assert shape(bodies[0]) == shape(sample("webhook.send.message.json"))
    assert bodies[0]["data"] == sent
    for body in bodies[1:]:
        assert list(body) == ENVELOPE_KEYS
        assert shape(body) == shape(sample(f"webhook.messages.update.{body['data']['status']}.json"))
        assert body["data"]["keyId"] == sent["key"]["id"] and body["data"]["instanceId"] == inst["id"]
    first = bodies[0]
    assert first["destination"] == request["webhook"]["url"]
    assert (first["instance"], first["sender"], first["apikey"], first["server_url"]) == (
        "my-instance", "5511988887777@s.whatsapp.net", inst["token"], sim.url)
    # Local time of UTC-3 labelled "Z", like Evolution's Docker image.
    stamp = datetime.strptime(first["date_time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert abs(stamp - (datetime.now(timezone.utc) - timedelta(hours=3))) < timedelta(seconds=10)
    assert receiver.requests[0]["headers"]["X-Shared-Secret"] == "change-me"
    assert receiver.requests[0]["headers"]["Content-Type"] == "application/json"


def test_events_filter_by_name(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver, events=["MESSAGES_UPDATE"])
    sim.send_text("my-instance")
    bodies = receiver.wait(3)
    time.sleep(0.1)
    assert {b["event"] for b in receiver.bodies()} == {"messages.update"} and len(bodies) == 3


def test_by_events_appends_the_kebab_event(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    url = _hook(sim, receiver, byEvents=True)
    sim.send_text("my-instance")
    receiver.wait(4)
    paths = [r["path"] for r in receiver.requests]
    assert paths[0] == "/hook/send-message" and set(paths[1:]) == {"/hook/messages-update"}
    assert {b["destination"] for b in receiver.bodies()} == {url}  # destination has no suffix


def test_global_webhook_by_events(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    sim.control("global", {"webhook_url": receiver.url + "/global", "by_events": True})
    sim.send_text("my-instance")
    updates = receiver.wait(3, path="/global/messages-update")
    assert shape(updates[1]) == shape(sample("webhook.global.messages.update.by-events.json"))
    assert updates[1]["destination"] == receiver.url + "/global/messages-update"
    assert "X-Shared-Secret" not in receiver.requests[0]["headers"]


def test_instance_and_global_webhooks_both_fire_with_one_destination(
        sim: Simulator, receiver: Receiver, inst: Json) -> None:
    url = _hook(sim, receiver, headers={"X-Only-Instance": "1"})
    sim.control("global", {"webhook_url": receiver.url + "/global"})
    sim.control("emit", {"instance": "my-instance", "event": "messages.upsert",
                         "data": sample("webhook.messages.upsert.inbound-text.json")["data"]})
    receiver.wait(2)
    by_path = {r["path"]: r for r in receiver.requests}
    assert by_path["/hook"]["body"] == by_path["/global"]["body"]
    assert by_path["/global"]["body"]["destination"] == url
    assert "X-Only-Instance" in by_path["/hook"]["headers"] and "X-Only-Instance" not in by_path["/global"]["headers"]


def test_jwt_key_becomes_a_bearer_token(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver, headers={"jwt_key": JWT_KEY, "X-Other": "kept"}, events=["SEND_MESSAGE"])
    sim.send_text("my-instance")
    receiver.wait(1)
    headers = receiver.requests[0]["headers"]
    assert "jwt_key" not in {h.lower() for h in headers} and headers["X-Other"] == "kept"
    scheme, token = headers["Authorization"].split(" ")
    claims = jwt.decode(token, JWT_KEY, algorithms=["HS256"])
    assert scheme == "Bearer" and list(claims) == ["iat", "exp", "app", "action"]
    assert claims["exp"] - claims["iat"] == 600 and (claims["app"], claims["action"]) == ("evolution", "webhook")


def test_a_5xx_is_retried_until_it_succeeds(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver, events=["SEND_MESSAGE"])
    receiver.plan["/hook"] = [500, 503]
    sim.send_text("my-instance")
    receiver.wait(3)
    assert [r["status"] for r in receiver.requests] == [500, 503, 200]
    gaps = [b["at"] - a["at"] for a, b in zip(receiver.requests, receiver.requests[1:])]
    assert gaps[0] >= 0.18 and gaps[1] >= 0.38  # 0.2 s then 0.4 s: exponential backoff
    stats = wait_for(lambda: (s := sim.stats()["webhook"])["ok"] == 1 and s)
    assert (stats["posted"], stats["retried"], stats["failed"]) == (3, 2, 0)


def test_non_retryable_statuses_stop_at_once(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver, events=["SEND_MESSAGE"])
    receiver.plan["/hook"] = [404]
    sim.send_text("my-instance")
    receiver.wait(1)
    wait_for(lambda: sim.stats()["webhook"]["failed"] == 1)
    time.sleep(0.3)
    assert len(receiver.requests) == 1 and sim.stats()["webhook"]["retried"] == 0


def test_unreachable_receiver_gives_up_after_max_attempts(sim: Simulator, inst: Json) -> None:
    sim.instance("my-instance", webhook={"url": "http://127.0.0.1:9/closed", "events": ["SEND_MESSAGE"]})
    sim.send_text("my-instance")
    stats = wait_for(lambda: (s := sim.stats()["webhook"])["failed"] == 1 and s, timeout=5)
    assert (stats["posted"], stats["retried"]) == (3, 2)


def test_drop_and_duplicate_rates(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver, events=["SEND_MESSAGE"])
    sim.instance("my-instance", faults={"webhook_drop_rate": 1})
    sim.send_text("my-instance")
    time.sleep(0.2)
    assert receiver.requests == [] and sim.stats()["webhook"]["dropped"] == 1
    sim.instance("my-instance", faults={"webhook_drop_rate": 0, "webhook_duplicate_rate": 1})
    sent = sim.send_text("my-instance").json()
    bodies = receiver.wait(2)
    assert [b["data"]["key"]["id"] for b in bodies] == [sent["key"]["id"]] * 2
    assert sim.stats()["webhook"]["duplicated"] == 1


def test_state_changes_emit_connection_update(sim: Simulator, receiver: Receiver, inst: Json) -> None:
    _hook(sim, receiver, events=["CONNECTION_UPDATE"])
    sim.instance("my-instance", state="close")
    sim.instance("my-instance", state="connecting")
    sim.instance("my-instance", state="open")
    # Near-simultaneous events travel on parallel connections (as with Evolution's axios
    # posts), so they may arrive in any order.
    by_state = {body["data"]["state"]: body for body in receiver.wait(3)}
    closed, connecting, opened = by_state["close"], by_state["connecting"], by_state["open"]
    assert closed["data"] == {"instance": "my-instance", "state": "close", "statusReason": 401}
    assert shape(closed) == shape(sample("webhook.connection.update.close.json"))
    assert connecting["data"] == sample("webhook.connection.update.connecting.json")["data"]
    assert opened["data"]["wuid"] == "5511988887777@s.whatsapp.net"
    assert list(opened["data"]) == list(sample("webhook.connection.update.open.json")["data"])


def test_every_pending_webhook_is_on_the_wire_at_once(sim: Simulator, inst: Json) -> None:
    """Like Evolution's axios on Node's default agent: no socket limit, so a slow receiver sees every
    pending event at once, and each timeout runs from its own POST (none waits for a socket first)."""
    events = 300  # more than any connection pool's usual limit (aiohttp: 100; ours was 256)
    state = {"in_flight": 0, "most": 0}
    lock, release = threading.Lock(), threading.Event()

    class Holding(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                state["in_flight"] += 1
                state["most"] = max(state["most"], state["in_flight"])
                if state["in_flight"] >= events:
                    release.set()
            release.wait(8)
            with lock:
                state["in_flight"] -= 1
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = events  # the listen backlog: the receiver is not what limits here

    server = Server(("127.0.0.1", 0), Holding)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sim.control("global", {"webhook_timeout_s": 10})
        sim.instance("my-instance", webhook={"enabled": True, "url": f"http://127.0.0.1:{server.server_address[1]}/h",
                                             "events": ["MESSAGES_UPDATE"]})
        sim.control("emit", {"instance": "my-instance", "event": "messages.update",
                             "batch": [{"keyId": f"K{i}", "status": "READ"} for i in range(events)]})
        assert release.wait(8), f"at most {state['most']} of {events} webhooks were on the wire together"
        stats = wait_for(lambda: (s := sim.stats()["webhook"])["ok"] == events and s, timeout=10)
        assert stats["retried"] == 0
    finally:
        server.shutdown()
