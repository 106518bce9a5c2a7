"""Fixtures for the simulator's own tests: the simulator as a subprocess and a webhook receiver.

These tests need no Django and no database (plain functions, no `db` fixture). They talk to
the simulator only over HTTP and AMQP, as the product does. RabbitMQ is expected at
SIMULATOR_TEST_RABBITMQ_URL (default: the broker `make test` starts on port 56720); the
RabbitMQ tests fail when it is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = Path(__file__).resolve().parent / "samples"  # Evolution's bodies, reconstructed from its source (README.md there)
API_KEY = "SIM-TEST-GLOBAL-KEY"
RABBITMQ_URL = os.environ.get("SIMULATOR_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:56720/")
# Unique names so runs sharing one broker never see each other's messages.
RUN_ID = uuid.uuid4().hex[:8]
Json = dict[str, Any]
EXCHANGE = f"simtest_{RUN_ID}"


def sample(name: str) -> Any:
    return json.loads((SAMPLES / name).read_text())


def shape(value: Any) -> Any:
    """Keys (in order) and JSON types, recursively; values are ignored."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0, message: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {message or predicate}; last={last!r}")


class Simulator:
    def __init__(self, base_url: str, process: subprocess.Popen[str]) -> None:
        self.url = base_url
        self.process = process
        self.http = requests.Session()

    def call(self, method: str, path: str, body: Any = None, key: str | None = API_KEY,
             raw: bytes | None = None, timeout: float = 10) -> requests.Response:
        headers = {"apikey": key} if key else {}
        if raw is not None:
            headers["Content-Type"] = "application/json"
            return self.http.request(method, self.url + path, data=raw, headers=headers, timeout=timeout)
        return self.http.request(method, self.url + path, json=body, headers=headers, timeout=timeout)

    def post(self, path: str, body: Any = None, **kw: Any) -> requests.Response:
        return self.call("POST", path, body, **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.call("GET", path, None, **kw)

    def send_text(self, instance: str, number: str = "5511999999999", text: str = "Olá! Seu pedido #123 foi confirmado.",
                  key: str | None = API_KEY, timeout: float = 10, **fields: Any) -> requests.Response:
        return self.post(f"/message/sendText/{instance}", {"number": number, "text": text, **fields}, key=key,
                         timeout=timeout)

    def control(self, path: str, body: Any = None) -> Any:
        response = self.http.post(f"{self.url}/_control/{path}", json=body if body is not None else {}, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def instance(self, name: str, **config: Any) -> Any:
        return self.control(f"instances/{name}", config)

    def stats(self) -> Any:
        return self.http.get(f"{self.url}/_control/stats", timeout=10).json()

    def sends(self, **filters: str) -> Any:
        return self.http.get(f"{self.url}/_control/sends", params=filters, timeout=10).json()


def start_simulator(*extra: str, env: dict[str, str] | None = None) -> tuple[str, subprocess.Popen[str]]:
    """Start `python -m simulator` on a free port; return its URL once it printed its ready line."""
    argv = [sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port", "0", *extra]
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, **(env or {})})
    assert process.stdout is not None
    line = process.stdout.readline().strip()  # blocks until ready (or exit)
    prefix = "simulator listening on "
    if not line.startswith(prefix):
        process.kill()
        raise RuntimeError(f"simulator did not start: {line!r} (exit {process.poll()})")
    return line[len(prefix):], process


@pytest.fixture(scope="session")
def sim() -> Iterator[Simulator]:
    url, process = start_simulator(
        "--api-key", API_KEY, "--rabbitmq-url", RABBITMQ_URL, "--exchange", EXCHANGE,
        "--prefix", EXCHANGE, "--no-rabbitmq-global",
    )
    yield Simulator(url, process)
    process.terminate()
    process.wait(timeout=10)


class Receiver:
    """A webhook receiver: records every POST; answers the planned statuses, then 200."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.plan: dict[str, list[int]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like a real web server

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    planned = receiver.plan.get(self.path)
                    status = planned.pop(0) if planned else 200
                    receiver.requests.append({"path": self.path, "headers": dict(self.headers), "raw": raw,
                                              "body": json.loads(raw), "status": status, "at": time.time()})
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self.plan.clear()

    def bodies(self, path: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [r["body"] for r in self.requests if path is None or r["path"] == path]

    def wait(self, count: int, path: str | None = None, timeout: float = 5.0) -> list[dict[str, Any]]:
        wait_for(lambda: len(self.bodies(path)) >= count, timeout, f"{count} webhooks on {path or 'any path'}")
        return self.bodies(path)


@pytest.fixture(scope="session")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


@pytest.fixture(autouse=True)
def clean(sim: Simulator, receiver: Receiver) -> Iterator[None]:
    # Every test starts from a blank simulator with fast webhook retries.
    sim.control("reset", {"global": True})
    sim.control("global", {"webhook_retry": {"initial_delay_s": 0.2, "max_delay_s": 1, "jitter": 0, "max_attempts": 3},
                           "webhook_timeout_s": 2, "auto_pair_ms": 100})
    receiver.clear()
    yield


@pytest.fixture
def inst(sim: Simulator) -> Json:
    """The samples' instance, open, with the samples' token and own jid."""
    config: Json = sim.instance("my-instance", token="B6D9F1A2-3C4E-4F5A-8B7C-9D0E1F2A3B4C",
                                owner_jid="5511988887777@s.whatsapp.net", profile_name="Loja Exemplo",
                                profile_picture_url=None)
    return config
