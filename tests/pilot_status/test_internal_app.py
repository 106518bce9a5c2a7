"""The webhook pool's app (pilot_status.internal_wsgi): the internal endpoints only, through the JSON
error envelope only, answering exactly what the full app answers for them."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.conf import settings

from ingestion import views
from messaging.models import Status
from pilot_status.internal_wsgi import application as internal_app
from pilot_status.wsgi import application as full_app
from tests.ingestion.helpers import make_message, receipt, token_header


class Answer:
    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status_code = int(status.split()[0])
        self.headers = {name.lower(): value for name, value in headers}
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def call(app: Any, method: str, path: str, body: bytes = b"", **headers: str) -> Answer:
    environ = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8001",
        "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json",
        "wsgi.url_scheme": "http", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1", **headers,
    }
    started: list[Any] = []
    body_out = b"".join(app(environ, lambda status, response_headers, *_: started.append((status, response_headers))))
    return Answer(started[0][0], started[0][1], body_out)


def secret() -> dict[str, str]:
    return {"HTTP_X_INTERNAL_WEBHOOK_SECRET": settings.INTERNAL_WEBHOOK_SECRET}


def test_it_applies_a_webhook(transactional_db, alice, alice_instance):
    message = make_message(alice.project, alice_instance)

    answer = call(internal_app, "POST", "/api/internal/webhook", json.dumps(receipt("DELIVERY_ACK")).encode(),
                  **token_header(alice_instance))

    assert answer.status_code == 200 and answer.json() == {"status": "processed", "reason": "applied"}
    message.refresh_from_db()
    assert message.status == Status.DELIVERED
    # None of the browser middleware ran: no clickjacking header, no cookie, no Vary: Cookie.
    assert not {"x-frame-options", "set-cookie", "vary"} & set(answer.headers)


def test_it_serves_the_counters(db):
    answer = call(internal_app, "GET", "/api/internal/metrics", **secret())
    assert answer.status_code == 200 and "counters" in answer.json()


@pytest.mark.parametrize("path", ["/admin/", "/dashboard/", "/v1/messages", "/bench/baseline/insert"])
def test_nothing_outside_the_internal_endpoints_is_served(db, path):
    answer = call(internal_app, "GET", path)
    assert answer.status_code == 404


@pytest.mark.parametrize(
    "method, path, body, headers",
    [
        ("GET", "/api/internal/webhook", b"", {}),  # 405 with Allow
        ("POST", "/api/internal/webhook", b"{not json", {}),  # 401 before anything else
        ("POST", "/api/internal/webhook", b"{not json", "token"),  # 400 invalid_json
        ("POST", "/api/internal/webhook", b'{"event": "x"}', "token"),  # 400 not_an_evolution_event
        ("POST", "/api/internal/webhook/messages-update", b"[]", "token"),  # the by-events form
        ("GET", "/api/internal/metrics", b"", {}),  # 401
        ("GET", "/metrics", b"", {"HTTP_AUTHORIZATION": "Bearer wrong"}),  # 401: Prometheus's scrape, its own token
        ("GET", "/api/internal/nope", b"", {}),  # JSON 404
    ],
)
def test_it_answers_what_the_full_app_answers(db, alice_instance, method, path, body, headers):
    if headers == "token":
        headers = {"HTTP_APIKEY": alice_instance.webhook_token, **token_header(alice_instance)}
    internal = call(internal_app, method, path, body, **headers)
    full = call(full_app, method, path, body, **headers)
    assert internal.status_code == full.status_code >= 400
    assert internal.json() == full.json()
    assert internal.headers.get("allow") == full.headers.get("allow")
    assert internal.headers["content-type"].startswith("application/json")


def test_a_crash_in_a_view_is_the_json_500(db, monkeypatch):
    def crash(request: Any) -> Any:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(views, "_webhook", crash)
    answer = call(internal_app, "POST", "/api/internal/webhook", b"{}")
    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "internal_error"
    assert b"secret internals" not in answer.body


@pytest.mark.stack
def test_the_pool_under_gunicorn_logs_failed_requests_only(db, tmp_path):
    # As the Procfile runs it: a success leaves no access line, a refusal does.
    import os
    import subprocess
    import sys

    import requests

    from tests.support.processes import free_port, test_database_url, wait_for_port

    port, log = free_port(), tmp_path / "access.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "pilot_status.internal_wsgi:application", "-b", f"127.0.0.1:{port}",
         "-w", "1", "--worker-class", "gthread", "--threads", "2", "--access-logfile", str(log),
         "--logger-class", "pilot_status.access_log.FailedRequestsOnly"],
        env={**os.environ, "DATABASE_URL": test_database_url()},
    )
    try:
        wait_for_port(port, proc=server)
        base = f"http://127.0.0.1:{port}/api/internal/metrics"
        assert requests.get(base, headers={"X-Internal-Webhook-Secret": settings.INTERNAL_WEBHOOK_SECRET}).status_code == 200
        assert requests.get(base + "?refused=1").status_code == 401
        assert requests.get(f"http://127.0.0.1:{port}/admin/").status_code == 404
    finally:
        server.terminate()
        server.wait(10)
    lines = log.read_text().splitlines()
    assert len(lines) == 2, lines
    assert '"GET /api/internal/metrics?refused=1 HTTP/1.1" 401' in lines[0]
    assert '"GET /admin/ HTTP/1.1" 404' in lines[1]
