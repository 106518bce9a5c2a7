"""A real HTTP webhook receiver on loopback that checks every request's Standard Webhooks signature.

`mode` says how it answers: "ok" (204), "error" (500) or it is "down" (its port closed, so a
connection is refused). It keeps every request it saw and whether its signature held. `delay` (seconds)
makes every answer wait that long first, like a slow customer server. `keep_alive` answers in HTTP/1.1 and
keeps the connection open for the next request, as most servers do (else HTTP/1.0: one per request).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.support.processes import free_port


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    verified: bool
    answered: int
    client_port: int = 0  # the sender's end of the TCP connection: one per connection
    at: float = field(default_factory=time.time)  # when it arrived (wall clock: compared with rows' times)

    @property
    def payload(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self, secret: Callable[[], str], answer_body: bytes = b"", delay: float = 0.0, keep_alive: bool = False):
        self.secret = secret  # read at each request: a test may rotate it
        self.answer_body = answer_body
        self.delay = delay
        self.keep_alive = keep_alive
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks/pilot?x=1"
        self.received: list[Received] = []
        self.mode = "down"
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if receiver.keep_alive else "HTTP/1.0"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    Webhook(receiver.secret()).verify(body, headers)
                    verified = True
                except WebhookVerificationError:
                    verified = False
                status = 500 if receiver.mode == "error" else (204 if verified else 400)
                if receiver.delay:
                    time.sleep(receiver.delay)
                with receiver._lock:
                    receiver.received.append(Received(headers, body, verified, status, self.client_address[1]))
                self.send_response(status)
                answer = receiver.answer_body if status != 204 else b""
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                if answer:
                    self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def set(self, mode: str) -> None:
        if mode == "down":
            self.stop()
        elif self._server is None:
            self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
            threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.mode = mode

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.mode = "down"

    def accepted(self) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.answered == 204]
