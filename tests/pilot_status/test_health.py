"""/healthz and /readyz (issue 24): alive without looking at anything; ready when Postgres, Redis and the
broker answer, with their latencies, and a 503 naming the one that does not, within a bounded time."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import Client

from pilot_status.health import run_within
from pilot_status.internal_wsgi import application as internal_app
from tests.pilot_status.test_internal_app import call
from tests.support.services import stopped

POD_ADDRESS = "10.42.0.17"  # what a Kubernetes probe sends as Host: the pod's IP, in no ALLOWED_HOSTS


@pytest.fixture(autouse=True)
def fresh_checks() -> Any:
    """Each test sees checks made for it, not the answer an earlier test left cached (test_readyz_cache)."""
    from pilot_status import health

    health.forget()
    yield
    health.forget()


def test_healthz_answers_alive_as_json(db: Any, client: Any) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"


def test_the_probes_skip_the_https_redirect_and_the_host_check_only_for_themselves(db: Any, settings: Any) -> None:
    settings.SECURE_SSL_REDIRECT = True
    client = Client()  # its middleware is built from these settings
    for path in ("/healthz", "/readyz"):
        response = client.get(path, HTTP_HOST=POD_ADDRESS)
        assert response.status_code == 200, (path, response.status_code)
    # Every other path is as strict as before: the pod's address is refused, plain HTTP redirected.
    assert client.get("/v1/messages", HTTP_HOST=POD_ADDRESS).status_code == 400
    assert client.get("/dashboard/login/", HTTP_HOST="127.0.0.1").status_code == 301


def test_readyz_reports_each_dependency_with_its_latency(db: Any, client: Any) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ready"
    assert set(body["checks"]) == {"postgres", "redis", "broker"}
    for name, check in body["checks"].items():
        assert check["ok"] is True, name
        assert isinstance(check["ms"], float) and 0 <= check["ms"] < 2000, (name, check)


@pytest.mark.serial
def test_readyz_is_503_naming_redis_while_redis_is_really_stopped(db: Any, client: Any, settings: Any) -> None:
    with stopped("redis"):
        started = time.monotonic()
        response = client.get("/readyz")
        elapsed = time.monotonic() - started
    assert response.status_code == 503
    assert elapsed < settings.READINESS_TIMEOUT_SECONDS + 1
    body = response.json()
    assert body["error"]["code"] == "not_ready"
    assert "redis" in body["error"]["message"]
    assert body["error"]["details"]["failed"] == ["redis"]
    assert body["checks"]["redis"]["ok"] is False
    # The kind of failure only: its text (internal addresses) goes to the log, not to whoever can reach the probe.
    assert body["checks"]["redis"]["error"] and ":" not in body["checks"]["redis"]["error"]
    assert body["checks"]["postgres"]["ok"] and body["checks"]["broker"]["ok"]
    assert response["Retry-After"] == "5"
    # Liveness never looks at Redis.
    assert client.get("/healthz").status_code == 200


def test_readyz_answers_within_its_timeout_when_a_dependency_hangs(db: Any, client: Any, settings: Any) -> None:
    settings.READINESS_TIMEOUT_SECONDS = 0.5
    # A broker address that never answers (TEST-NET-1, RFC 5737: nothing routes there).
    settings.CELERY_BROKER_URL = "amqp://guest:guest@192.0.2.1:5672//"
    started = time.monotonic()
    response = client.get("/readyz")
    assert time.monotonic() - started < 1.5
    assert response.status_code == 503
    assert response.json()["error"]["details"]["failed"] == ["broker"]


def test_a_check_that_never_returns_is_reported_at_the_deadline() -> None:
    started = time.monotonic()
    results = run_within({"fast": lambda: 1, "hung": lambda: time.sleep(30)}, 0.3)
    assert time.monotonic() - started < 1
    assert results["fast"]["ok"] and results["fast"]["value"] == 1
    assert results["hung"] == {"ok": False, "ms": 300.0, "error": "no answer within 0.3 s"}


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_the_webhook_pool_answers_the_probes_too(db: Any, path: str) -> None:
    answer = call(internal_app, "GET", path, HTTP_HOST=POD_ADDRESS)
    assert answer.status_code == 200, answer.body
    assert answer.json()["status"] in ("ok", "ready")


def test_the_probes_answer_get_and_head_only(db: Any, client: Any) -> None:
    assert client.head("/healthz").status_code == 200
    response = client.post("/healthz")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_the_compose_probe_exits_0_on_a_ready_server_and_1_otherwise(transactional_db: Any, live_server: Any) -> None:
    # docker-compose.yml's healthcheck for web and webhook: `python -m pilot_status.probe URL`.
    import subprocess
    import sys

    def probe(url: str) -> int:
        return subprocess.run([sys.executable, "-m", "pilot_status.probe", url], capture_output=True, timeout=30).returncode

    assert probe(f"{live_server.url}/readyz") == 0
    assert probe(f"{live_server.url}/no-such-page") == 1
    assert probe("http://127.0.0.1:1/readyz") == 1  # nothing listens
