"""Hostile input against the real webhook pool (issue 21): gunicorn running pilot_status.internal_wsgi as the
Procfile does, spoken to over raw sockets so that header bytes arrive exactly as written (non-ASCII, huge).
Every answer is a 4xx in the JSON error envelope, the worker never logs an unexpected error, and a real
receipt still goes through afterwards."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from messaging.models import Status
from tests.ingestion.helpers import make_message, receipt
from tests.support import processes
from tests.support.processes import free_port, wait_for_port

pytestmark = pytest.mark.stack
PATH = "/api/internal/webhook"


@pytest.fixture
def webhook_pool(tmp_path) -> Iterator[tuple[int, Any, int]]:
    port, log = free_port(), tmp_path / "webhook.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "pilot_status.internal_wsgi:application", "-b", f"127.0.0.1:{port}",
             "-w", "1", "--worker-class", "gthread", "--threads", "2", "--timeout", "30"],
            env={**os.environ, "DATABASE_URL": processes.test_database_url(), "PYTHONUNBUFFERED": "1"},
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, proc=server)
        yield port, log, server.pid
    finally:
        server.terminate()
        server.wait(10)


def send(port: int, body: bytes, headers: list[tuple[bytes, bytes]] = (), path: str = PATH) -> tuple[int, bytes]:
    """One raw HTTP/1.1 POST; (status, body)."""
    head = [f"POST {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Content-Type: application/json",
            f"Content-Length: {len(body)}".encode(), b"Connection: close"]
    head += [name + b": " + value for name, value in headers]
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.read()


def body_of(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def deep(levels: int = 5_000) -> bytes:
    return b"[" * levels + b"]" * levels


def hostile_requests(token: bytes) -> list[tuple[str, bytes, list[tuple[bytes, bytes]], int]]:
    """(what, body, headers, expected status)."""
    secret = settings.INTERNAL_WEBHOOK_SECRET.encode()
    lone_surrogate = body_of(receipt("DELIVERY_ACK")).replace(b'"apikey": "B6D9F1A2-3C4E-4F5A-8B7C-9D0E1F2A3B4C"',
                                                              b'"apikey": "\\ud800"')
    assert b"\\ud800" in lone_surrogate
    forward = dict(receipt("READ"), already_saved=True)
    return [
        ("deep nesting, stranger", deep(), [], 401),
        ("deep nesting, our own process", deep(), [(b"x-internal-webhook-secret", secret)], 400),
        ("deep nesting inside data", b'{"event": "messages.update", "instance": "alice-main", "data": ' + deep() + b"}",
         [(b"x-webhook-token", token)], 401),
        ("non-ASCII x-webhook-token", body_of(receipt("DELIVERY_ACK")), [(b"x-webhook-token", "tökén".encode())], 401),
        ("latin-1 x-webhook-token", body_of(receipt("DELIVERY_ACK")), [(b"x-webhook-token", b"\xe9\xff\x80")], 401),
        ("lone surrogate apikey", lone_surrogate, [], 401),
        ("NUL in the instance", body_of(receipt("DELIVERY_ACK", instance="alice-main\x00")),
         [(b"x-webhook-token", token)], 401),
        ("60 KB instance name", body_of(receipt("DELIVERY_ACK", instance="x" * 60_000)), [], 401),
        ("instance as a list", body_of(dict(receipt("DELIVERY_ACK"), instance=["alice-main"])),
         [(b"x-webhook-token", token)], 401),
        ("truncated UTF-8", b'{"event": "messages.update", "instance": "alice-main", "data": {"t": "\xe2\x82"}}',
         [(b"x-webhook-token", token)], 401),
        ("truncated UTF-8, our own process", b'{"event": "\xe2\x82"}', [(b"x-internal-webhook-secret", secret)], 400),
        ("non-ASCII Bearer", body_of(receipt("DELIVERY_ACK")), [(b"authorization", "Bearer ünï.cö.de".encode())], 401),
        ("huge Bearer", body_of(receipt("DELIVERY_ACK")), [(b"authorization", b"Bearer " + b"a" * 7_000)], 401),
        ("non-ASCII internal secret", body_of(forward), [(b"x-internal-webhook-secret", "sécret".encode())], 401),
        ("event name too long", body_of(dict(receipt("DELIVERY_ACK"), event="x" * 500)),
         [(b"x-webhook-token", token)], 400),
        ("data as a string", body_of(dict(receipt("DELIVERY_ACK"), data="x")), [(b"x-webhook-token", token)], 400),
        ("huge number", b'{"event": "messages.update", "instance": "alice-main", "data": {"n": 1' + b"0" * 3000 + b"}}",
         [(b"x-internal-webhook-secret", secret)], 400),
    ]


def test_hostile_input_gets_a_4xx_envelope_from_the_real_webhook_pool(transactional_db, alice, alice_instance,
                                                                     webhook_pool):
    port, log, _ = webhook_pool
    token = alice_instance.webhook_token.encode()
    message = make_message(alice.project, alice_instance)

    for what, body, headers, expected in hostile_requests(token):
        status, answer = send(port, body, headers)
        assert status == expected, (what, status, answer[:300])
        assert set(json.loads(answer)["error"]) >= {"code", "message", "details"}, what

    # Too big for the pool (DATA_UPLOAD_MAX_MEMORY_SIZE): a 4xx too, whoever asks.
    status, _ = send(port, b'{"pad": "' + b"x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10) + b'"}')
    assert 400 <= status < 500

    # And the worker still serves a real receipt.
    status, answer = send(port, body_of(receipt("DELIVERY_ACK")), [(b"x-webhook-token", token)])
    assert status == 200 and json.loads(answer) == {"status": "processed", "reason": "applied"}
    message.refresh_from_db()
    assert message.status == Status.DELIVERED
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "unexpected error" not in text, text[-3000:]


def worker_rss_kb(master_pid: int) -> int:
    """VmRSS of the pool's one worker (the master's child)."""
    from pathlib import Path

    children = [int(c) for task in Path(f"/proc/{master_pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    assert len(children) == 1, children
    for line in Path(f"/proc/{children[0]}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_unauthenticated_junk_does_not_grow_the_webhook_worker(transactional_db, alice_instance, webhook_pool):
    # Issue 21 measured 185 MB over two workers for 3,000 junk webhooks with 60 KB instance names.
    import requests

    port, _, master = webhook_pool
    url = f"http://127.0.0.1:{port}{PATH}"
    session = requests.Session()

    def junk(name: str) -> int:
        body = dict(receipt("DELIVERY_ACK", instance=name), apikey="wrong")
        return session.post(url, data=json.dumps(body), headers={"Content-Type": "application/json"}).status_code

    for n in range(200):  # warm-up: the worker's imports, pools and first allocations
        junk(f"warm-{n}" + "w" * 60_000)
        junk(f"warm-{n}")
    before = worker_rss_kb(master)
    for n in range(1_000):
        assert junk(f"{n:05d}" + "x" * 60_000) == 401  # too long for a name: no lookup, nothing kept
        assert junk(f"junk-{n:05d}-" + "y" * 80) == 401  # a possible name: remembered, within the bound
    grown_kb = worker_rss_kb(master) - before
    assert grown_kb < 10 * 1024, f"the worker grew by {grown_kb / 1024:.1f} MB over 2,000 junk webhooks"
