"""Callbacks on for every message of a project while a scenario runs (B3; issue 23: "callbacks must never
slow an OTP"), or for a backlog of status changes drained at once (B7: deliveries per second).

- `Receiver`: a threaded HTTP server on loopback in the bench process that answers 200 to every POST at
  once and counts them (with each one's arrival time and its `webhook-id`, so that a copy delivered twice is
  counted apart); it checks the Standard Webhooks signature of the first and then every
  SIGNATURE_SAMPLE-th one with the endpoint's secret (checking all would only load the bench's own process).
- `callbacks_on(project, receiver)`: registers a `message.status` endpoint for the project pointing at the
  receiver (through callbacks.endpoints, as the API does) and, since the bench runs no beat, publishes the
  `callbacks.relay` task to the `callbacks` queue every CALLBACKS_RELAY_SECONDS, as beat's entry does
  (with the same expiry: a tick that waited a whole period is dropped). With `relay=False` the caller starts
  the ticks itself (`RelayTicker`), so that the deliveries owed pile up first (B7). On exit it stops the
  ticks and disables the endpoint, so nothing more is delivered.

ctx.fresh() empties the callbacks tables too (bench.world.SCENARIO_TABLES), so each run registers its own
and every other scenario runs without an endpoint, as before.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

SIGNATURE_SAMPLE = 25  # every n-th callback's signature is checked (and the first)


@dataclass
class Tally:
    received: int = 0
    verified: int = 0
    bad_signatures: int = 0
    duplicates: int = 0  # a `webhook-id` received before (a retry or a second task of one delivery)
    # message id → callbacks received for it (which of the measured OTPs got theirs)
    by_message: dict[str, int] = field(default_factory=dict)


class Receiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.secret = ""
        self.tally = Tally()
        self._arrivals: list[float] = []  # time.time() of each POST, in arrival order
        self._webhook_ids: set[str] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/bench/callbacks"
        self._thread = threading.Thread(target=self._server.serve_forever, name="callbacks-receiver", daemon=True)
        self._thread.start()

    def reset(self, secret: str) -> None:
        """Count from zero, and check signatures with this secret (a new endpoint's)."""
        with self._lock:
            self.secret = secret
            self.tally = Tally()
            self._arrivals = []
            self._webhook_ids = set()

    def snapshot(self) -> Tally:
        with self._lock:
            return Tally(self.tally.received, self.tally.verified, self.tally.bad_signatures, self.tally.duplicates,
                         dict(self.tally.by_message))

    def arrivals(self) -> list[float]:
        """When each callback arrived (epoch seconds), in arrival order."""
        with self._lock:
            return list(self._arrivals)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keeps the connection for the next callback, as most servers do

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()
                receiver._count(body, {k.lower(): v for k, v in self.headers.items()})

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def _count(self, body: bytes, headers: dict[str, str]) -> None:
        arrived = time.time()
        webhook_id = headers.get("webhook-id", "")
        with self._lock:
            self.tally.received += 1
            self._arrivals.append(arrived)
            if webhook_id in self._webhook_ids:
                self.tally.duplicates += 1
            self._webhook_ids.add(webhook_id)
            n, secret = self.tally.received, self.secret
        check = n == 1 or n % SIGNATURE_SAMPLE == 0
        verified = bad = 0
        if check and secret:
            try:
                Webhook(secret).verify(body, headers)
                verified = 1
            except WebhookVerificationError:
                bad = 1
        try:
            message_id = str(json.loads(body)["data"]["messageId"])
        except (ValueError, KeyError, TypeError):
            message_id = ""
        with self._lock:
            self.tally.verified += verified
            self.tally.bad_signatures += bad
            if message_id:
                self.tally.by_message[message_id] = self.tally.by_message.get(message_id, 0) + 1

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class RelayTicker:
    """What beat's `relay-callbacks` entry does, from a thread of the bench process."""

    def __init__(self, period: float):
        self.period = period
        self.published = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="callbacks-relay-ticker", daemon=True)

    def _run(self) -> None:
        from bench.celery_app import app
        from pilot_status.celery import CALLBACKS_RELAY_QUEUE

        while not self._stop.is_set():
            app.send_task("callbacks.relay", queue=CALLBACKS_RELAY_QUEUE, expires=self.period)
            self.published += 1
            self._stop.wait(self.period)

    def start(self) -> RelayTicker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@contextmanager
def callbacks_on(project: Any, receiver: Receiver, relay: bool = True, description: str = "bench B3") -> Iterator[Any]:
    """A `message.status` endpoint of `project` at `receiver`, and (unless `relay` is False: the caller starts
    a RelayTicker when it wants the deliveries to go) the relay pass ticking, for the block."""
    from django.conf import settings

    from callbacks import endpoints
    from callbacks.models import EventType
    from messaging.models import Environment

    endpoint = endpoints.create(project, Environment.LIVE, receiver.url, [EventType.MESSAGE_STATUS.value],
                                description=description)
    receiver.reset(endpoint.secret)
    ticker = RelayTicker(float(settings.CALLBACKS_RELAY_SECONDS)).start() if relay else None
    try:
        yield endpoint
    finally:
        if ticker is not None:
            ticker.stop()
        # Disabled, not deleted: a delivery still in flight writes its attempt row, which a delete that
        # cascades at the same moment would collide with. ctx.fresh() empties the table before the next run.
        endpoints.update(endpoint, {"enabled": False})
        # What is still queued would only find the endpoint disabled; dropping it now spares the next
        # ctx.fresh() (a TRUNCATE under a short lock timeout) the tasks' row locks.
        _purge_callbacks_queue()


def _purge_callbacks_queue() -> None:
    from bench.celery_app import app
    from bench.context import purge
    from pilot_status.celery import CALLBACKS_QUEUE, CALLBACKS_RELAY_QUEUE

    with app.connection_for_write() as conn:
        purge(conn, (CALLBACKS_QUEUE, CALLBACKS_RELAY_QUEUE))
