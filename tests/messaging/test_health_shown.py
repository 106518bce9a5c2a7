"""A number's health where people look (messaging.governor): the gauge `pilot_status_instance_health` and the
dashboard's instances, each with its state and its last change."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from messaging import governor
from messaging.models import Instance
from tests.conftest import add_instance

TOKEN = "metrics-token-for-the-tests-0123456789abcdef"


@pytest.fixture
def number(alice):
    return add_instance(alice.project, "alice-phone", priority=10, profile="unofficial")


def test_the_gauge_shows_each_instances_health(transactional_db, alice, alice_instance, number, settings, client):
    # transactional_db: the scrape reads on a thread of its own, with its own connection
    settings.METRICS_TOKEN = TOKEN
    number.refresh_from_db()
    governor.connection(number, "close", 401, number.set_connection_state("close"))  # a logout: resting
    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    assert 'pilot_status_instance_health{name="alice-phone"} 2.0' in text
    assert 'pilot_status_instance_health{name="alice-main"} 0.0' in text
    assert 'pilot_status_scrape_source_up{source="health"} 1.0' in text
    governor.override(Instance.objects.get(pk=number.pk), "restricted", "ops")
    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    assert 'pilot_status_instance_health{name="alice-phone"} 3.0' in text


def test_the_dashboard_shows_each_instances_health_and_its_last_change(alice, alice_instance, number, bob):
    browser = Client()
    browser.force_login(bob)
    page = browser.get(f"/dashboard/p/{alice.project.pk}/").content.decode()
    assert 'id="health-alice-phone"' in page and 'id="health-change-alice-phone"' not in page  # never changed

    # A 463 on a cold contact: at risk, and no new contacts for a while.
    Instance.objects.filter(pk=number.pk).update(health_state="healthy")
    number.refresh_from_db()
    now = timezone.now()
    governor._apply(number, "at_risk", "cold_contact_errors", {"errors": 1}, now + timedelta(hours=20),
                    governor.GOVERNOR, now)
    page = browser.get(f"/dashboard/p/{alice.project.pk}/").content.decode()
    assert 'class="badge health-at_risk" id="health-alice-phone"' in page
    shown = page.split('id="health-change-alice-phone">')[1].split("</span>")[0]
    assert shown.startswith("healthy → at risk") and "WhatsApp refused a message to a new contact (463)" in shown
    assert "no new contacts until" in shown
    assert 'class="badge health-healthy" id="health-alice-main"' in page


def test_the_api_shows_the_state_its_last_change_and_a_cooling_period(alice, number):
    row = next(r for r in alice.client().get("/v1/instances").json()["data"] if r["name"] == "alice-phone")
    assert (row["healthState"], row["healthChangedAt"], row["coldContactsPausedUntil"]) == ("healthy", None, None)
    number.refresh_from_db()
    now = timezone.now()
    governor._apply(number, "at_risk", "cold_contact_errors", {"errors": 1}, now + timedelta(hours=20),
                    governor.GOVERNOR, now)
    row = next(r for r in alice.client().get("/v1/instances").json()["data"] if r["name"] == "alice-phone")
    assert row["healthState"] == "at_risk" and row["healthChangedAt"] and row["coldContactsPausedUntil"]
