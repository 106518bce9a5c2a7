"""GET /metrics (issue 24): Prometheus's scrape behind its own token, with the latency histograms merged over the
stack's processes (prometheus_client's multiprocess mode), the gauges read at scrape time and the Redis
counters; a scrape answers with whatever it could read when Redis is away."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from messaging import opt_ins
from messaging.models import Message
from pilot_status import heartbeats, metrics
from tests.support.services import stopped
from tests.support.simulator import wait_until

TOKEN = "metrics-token-for-the-tests-0123456789abcdef"
HISTOGRAMS = ("pilot_status_accept_seconds", "pilot_status_accept_to_sent_seconds",
              "pilot_status_gateway_call_seconds", "pilot_status_webhook_seconds")
GAUGES = ("pilot_status_outbox_depth", "pilot_status_outbox_due", "pilot_status_outbox_oldest_age_seconds",
          "pilot_status_outbox_oldest_due_age_seconds", "pilot_status_queue_ready", "pilot_status_circuit_state",
          "pilot_status_heartbeat_age_seconds", "pilot_status_heartbeat_stale", "pilot_status_scrape_source_up",
          "pilot_status_instance_health")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a scrape (parsed by prometheus_client's own parser)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text) for sample in family.samples
    }


def families(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str, **labels: str) -> float:
    return found.get((metric, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.parametrize("urlconf", ["pilot_status.urls", "pilot_status.internal_urls"])
def test_the_scrape_needs_its_own_token(db: Any, client: Any, settings: Any, urlconf: str) -> None:
    settings.ROOT_URLCONF = urlconf
    settings.METRICS_TOKEN = TOKEN
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": TOKEN},
                    {"HTTP_AUTHORIZATION": "Bearer " + "x" * 10_000},
                    {"HTTP_X_INTERNAL_WEBHOOK_SECRET": settings.INTERNAL_WEBHOOK_SECRET},
                    {"HTTP_AUTHORIZATION": f"Bearer {settings.INTERNAL_WEBHOOK_SECRET}"}):
        response = client.get("/metrics", **headers)
        assert response.status_code == 401, headers
        assert response.json()["error"]["code"] == "unauthorized"
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    assert response["Cache-Control"] == "no-store"
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405
    settings.METRICS_TOKEN = ""  # unset (development only: production mode requires it): nobody gets in
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_the_redis_counters_are_exported_as_they_are(db: Any, client: Any, settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    metrics.evolution("webhook:processed", 3)
    metrics.evolution("gateway:misconfigured")
    metrics.messages("status:DELIVERED:otp", 2)
    metrics.messages("failed:EXPIRED:marketing")

    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()

    found = samples(text)
    assert value(found, "pilot_status_evolution_webhook_processed_total") == 3
    assert value(found, "pilot_status_evolution_gateway_misconfigured_total") == 1
    assert value(found, "pilot_status_messages_status_total", lane="otp", status="DELIVERED") == 2
    assert value(found, "pilot_status_messages_failed_total", lane="marketing", reason="EXPIRED") == 1
    assert "# TYPE pilot_status_evolution_webhook_processed_total counter" in text  # as the old text output
    assert value(found, "pilot_status_scrape_source_up", source="counters") == 1


@pytest.mark.serial
def test_with_redis_stopped_the_scrape_still_answers_with_what_it_can_read(db: Any, client: Any,
                                                                         settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    with stopped("redis"):
        started = time.monotonic()
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        took = time.monotonic() - started
    assert response.status_code == 200
    assert took < settings.METRICS_SCRAPE_TIMEOUT_SECONDS + 1.5
    found = samples(response.content.decode())
    for source in ("counters", "heartbeats", "circuits"):  # each reads Redis
        assert value(found, "pilot_status_scrape_source_up", source=source) == 0, source
    assert value(found, "pilot_status_scrape_source_up", source="outbox") == 1  # Postgres is there
    assert ("pilot_status_outbox_depth", (("lane", "otp"),)) in found


def scrape(stack: Any) -> str:
    response = requests.get(f"{stack.web_url}/metrics", headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"},
                            timeout=10)
    assert response.status_code == 200, response.text
    return response.text


def test_after_a_real_send_every_histogram_and_gauge_is_served_and_moves(stack: Any, simulator: Any, alice: Any,
                                                                         alice_instance: Any) -> None:
    # The stack's processes and this one read the same METRICS_TOKEN (scripts/env.sh).
    simulator.register(alice_instance, stack.webhook_url)
    opt_ins.record(alice.project, "+5511988887777", "signup form")
    # Each test starts on an empty Redis: the stack's relay writes its heartbeat again within HEARTBEAT_SECONDS.
    wait_until(lambda: any(beat["process"].startswith("relay") for beat in heartbeats.processes()), timeout=15,
               message="the relay's heartbeat")
    before = samples(scrape(stack))

    response = requests.post(
        f"{stack.web_url}/v1/messages/send",
        json={"to": "+5511988887777", "category": "UTILITY", "text": "Order 42 shipped"},
        headers={"Authorization": f"Bearer {alice.live_key}"}, timeout=10,
    )
    assert response.status_code == 202, response.text
    wait_until(lambda: Message.objects.filter(pk=response.json()["id"], status="READ").exists(), timeout=20,
               message="READ")

    # The workers' counters reach Redis within METRICS_FLUSH_SECONDS (the stack keeps the default, 1 s).
    sent = ("pilot_status_messages_status_total", (("lane", "utility"), ("status", "SENT")))
    text = wait_until(lambda: (lambda t: t if samples(t).get(sent, 0) > before.get(sent, 0) else None)(scrape(stack)),
                      timeout=10, interval=0.3, message="the SENT counter")
    after = samples(text)
    served = families(text)
    for name in (*HISTOGRAMS, *GAUGES):
        assert name in served, name

    def moved(metric: str, **labels: str) -> float:
        return value(after, metric, **labels) - value(before, metric, **labels)

    # Observed in three processes (web, the utility lane's worker, the webhook handling on web), one scrape.
    assert moved("pilot_status_accept_seconds_count", status="202") == 1
    assert moved("pilot_status_accept_to_sent_seconds_count", lane="utility") == 1
    assert moved("pilot_status_gateway_call_seconds_count", outcome="sent") == 1
    assert moved("pilot_status_webhook_seconds_count", status="200") >= 3  # SERVER_ACK, DELIVERED, READ at least
    assert value(after, "pilot_status_accept_to_sent_seconds_bucket", lane="utility", le="+Inf") >= 1
    assert moved("pilot_status_messages_status_total", lane="utility", status="SENT") == 1
    # The gauges, read at scrape time from Postgres, RabbitMQ and Redis.
    for source in ("outbox", "queues", "circuits", "heartbeats", "counters"):
        assert value(after, "pilot_status_scrape_source_up", source=source) == 1, source
    assert ("pilot_status_outbox_depth", (("lane", "utility"),)) in after
    assert ("pilot_status_queue_ready", (("queue", "utility"),)) in after
    assert after[("pilot_status_circuit_state", (("name", ""), ("scope", "gateway")))] == 0  # closed
    assert any(name == "pilot_status_heartbeat_age_seconds" and dict(labels)["process"].startswith("relay")
               for name, labels in after)


def test_the_grafana_dashboard_draws_every_histogram_gauge_and_counter() -> None:
    import json

    from tests.support.processes import ROOT

    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = "\n".join(target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", []))
    for histogram in HISTOGRAMS:
        assert f"histogram_quantile(0.5, sum by (le" in exprs and f"{histogram}_bucket" in exprs, histogram
    for name in (*GAUGES, "pilot_status_messages_status_total", "pilot_status_messages_failed_total"):
        assert name in exprs, name
