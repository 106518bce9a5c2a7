"""The overview's charts' data (dashboard.charts, /dashboard/p/<id>/charts.json) through Django's test client:
the hours, the counts by status, the delivery percentiles, one project's messages only, bounded queries."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path

import psycopg
import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from dashboard import charts
from dashboard.views import CHART_JS
from messaging import operators
from messaging.models import Message, Status
from tests.conftest import add_instance

NOW = datetime(2026, 12, 1, 14, 30, tzinfo=dt_timezone.utc)
ASSETS = Path(charts.__file__).resolve().parent / "static" / "dashboard"


def make_message(actor, instance, status: str, created: datetime, took: float | None = None) -> Message:
    """A message accepted at `created`, delivered `took` seconds later (when given)."""
    delivered = created + timedelta(seconds=took) if took is not None else None
    return Message.objects.create(
        project=actor.project, environment="LIVE", category="UTILITY", to="+5511988887777", template="hi",
        text="hi", instance=instance, deliver_until=created + timedelta(hours=1), status=status,
        created_at=created, delivered_at=delivered,
    )


@pytest.fixture
def frozen():
    with time_machine.travel(NOW, tick=False):
        yield NOW


@pytest.fixture
def bob_browser(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


def url(actor) -> str:
    return f"/dashboard/p/{actor.project.pk}/charts.json"


def counts(body: dict, status: str) -> list[int]:
    return next(s["counts"] for s in body["byStatus"] if s["status"] == status)


def test_it_counts_the_last_24_hours_by_hour_and_status(frozen, bob_browser, alice, alice_instance):
    this_hour = NOW.replace(minute=0)
    make_message(alice, alice_instance, Status.DELIVERED, NOW - timedelta(minutes=5), took=10)
    make_message(alice, alice_instance, Status.DELIVERED, this_hour, took=20)
    make_message(alice, alice_instance, Status.QUEUED, NOW)
    make_message(alice, alice_instance, Status.READ, NOW - timedelta(hours=3), took=30)
    make_message(alice, alice_instance, Status.FAILED, NOW - timedelta(hours=3))
    make_message(alice, alice_instance, Status.SENT, NOW - timedelta(hours=3, minutes=29))
    # the first hour of the window (yesterday 15:00) is in; the minute before it is not
    make_message(alice, alice_instance, Status.SERVER_ACK, this_hour - timedelta(hours=23))
    make_message(alice, alice_instance, Status.DELIVERED, this_hour - timedelta(hours=23, seconds=1), took=5)

    body = bob_browser.get(url(alice)).json()

    assert body["hours"][0] == "2026-11-30T15:00:00Z" and body["hours"][-1] == "2026-12-01T14:00:00Z"
    assert len(body["hours"]) == 24
    assert [s["status"] for s in body["byStatus"]] == list(Status.values)
    assert all(len(s["counts"]) == 24 for s in body["byStatus"])
    assert counts(body, "DELIVERED")[-1] == 2 and counts(body, "QUEUED")[-1] == 1
    assert counts(body, "READ")[-4] == 1 and counts(body, "FAILED")[-4] == 1 and counts(body, "SENT")[-4] == 1
    assert counts(body, "SERVER_ACK")[0] == 1
    assert sum(sum(s["counts"]) for s in body["byStatus"]) == 7
    # delivered and read messages have a delivery time; the rest are not in the percentiles
    assert body["latency"]["delivered"][-1] == 2 and body["latency"]["delivered"][-4] == 1
    assert body["latency"]["p50"][-1] == 15.0 and body["latency"]["p50"][-4] == 30.0
    assert body["latency"]["p50"][0] is None and sum(body["latency"]["delivered"]) == 3


def test_the_percentiles_are_p50_p90_p99_of_accept_to_delivered(frozen, bob_browser, alice, alice_instance):
    start = NOW.replace(minute=0) - timedelta(hours=1)
    for seconds in range(1, 101):  # 1 s .. 100 s, in the hour before this one
        make_message(alice, alice_instance, Status.DELIVERED, start + timedelta(seconds=seconds), took=seconds)

    latency = bob_browser.get(url(alice)).json()["latency"]

    # percentile_cont interpolates: p50 of 1..100 is 50.5, p90 90.1, p99 99.01
    assert (latency["p50"][-2], latency["p90"][-2], latency["p99"][-2]) == (50.5, 90.1, 99.01)
    assert latency["delivered"][-2] == 100 and latency["unit"] == "seconds"
    assert latency["p50"][-1] is None


def test_another_projects_messages_never_count(frozen, bob_browser, alice, alice_instance, carol):
    carol_instance = add_instance(carol.project, "carol-main")
    make_message(alice, alice_instance, Status.DELIVERED, NOW, took=3)
    for _ in range(5):
        make_message(carol, carol_instance, Status.DELIVERED, NOW, took=600)
    make_message(carol, carol_instance, Status.FAILED, NOW)
    # a Pilot Status (shared) instance carrying carol's message changes nothing either
    shared = add_instance(None, "pilot-official", official=True)
    make_message(carol, shared, Status.READ, NOW, took=900)

    body = bob_browser.get(url(alice)).json()

    assert sum(sum(s["counts"]) for s in body["byStatus"]) == 1
    assert counts(body, "FAILED") == [0] * 24
    assert body["latency"]["p99"][-1] == 3.0 and body["latency"]["delivered"][-1] == 1


def test_only_members_see_a_projects_charts(frozen, alice, alice_instance, carol):
    make_message(alice, alice_instance, Status.DELIVERED, NOW, took=3)
    anonymous = Client().get(url(alice))
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/dashboard/login/")

    operators.create_member(carol.project.pk, "dave", "dave-password-123")
    dave = Client()
    dave.force_login(get_user_model().objects.get(username="dave"))
    refused = dave.get(url(alice))
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    assert dave.get(url(carol)).status_code == 200


def test_the_charts_cost_two_grouped_queries_served_by_the_project_created_index(
    frozen, bob_browser, alice, alice_instance, django_assert_max_num_queries
):
    for hours_ago in range(30):
        make_message(alice, alice_instance, Status.DELIVERED, NOW - timedelta(hours=hours_ago), took=hours_ago + 1)
    buckets = charts.hours()
    # session + user, the membership check, statement_timeout, the two charts (and the atomic block's savepoint
    # statements the test transaction adds): nothing grows with the traffic
    with django_assert_max_num_queries(9):
        assert bob_browser.get(url(alice)).status_code == 200

    # msg_project_created (project_id, environment, created_at DESC) answers both queries' WHERE: with sequential scans
    # priced out (the test table is tiny), Postgres picks it for each
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in (charts._in_window(alice.project, "LIVE", buckets).values("status"),
                      charts._in_window(alice.project, "LIVE", buckets).filter(delivered_at__isnull=False).values("id")):
            plan = query.explain()
            assert "msg_project_created" in plan, plan


def test_a_query_past_its_timeout_answers_503_and_the_page_still_loads(settings, bob_browser, alice):
    settings.DASHBOARD_CHART_TIMEOUT_MS = 200
    db = connection.settings_dict
    # Another session holds the messages table: the charts' query waits for it until the timeout cancels it.
    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"],
                         dbname=db["NAME"], autocommit=False) as holder:
        holder.execute("SET lock_timeout = '5s'")
        holder.execute("LOCK TABLE messaging_message IN ACCESS EXCLUSIVE MODE")
        response = bob_browser.get(url(alice))
        holder.rollback()
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "charts_unavailable"
    # the overview itself does not run the charts' queries
    assert bob_browser.get(f"/dashboard/p/{alice.project.pk}/").status_code == 200


def test_the_page_loads_the_vendored_chart_library_under_its_policy(bob_browser, alice):
    page = bob_browser.get(f"/dashboard/p/{alice.project.pk}/")
    html = page.content.decode()
    policy = page["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert f'src="/dashboard/assets/{CHART_JS}"' in html and 'src="/dashboard/assets/charts.js"' in html
    assert "<script>" not in html and "http://" not in html and "https://" not in html

    library = bob_browser.get(f"/dashboard/assets/{CHART_JS}")
    assert library.status_code == 200 and library["Content-Type"] == "text/javascript"
    body = b"".join(library.streaming_content)
    # byte for byte the file VENDORED.md names, at the version the file name pins
    vendored = (ASSETS / "VENDORED.md").read_text()
    digest = re.search(rf"`{re.escape(CHART_JS)}`.*`([0-9a-f]{{64}})`", vendored)
    assert digest and hashlib.sha256(body).hexdigest() == digest.group(1)
    version = re.match(r"chart-(\d+\.\d+\.\d+)\.umd\.min\.js", CHART_JS)
    assert version and f"Chart.js v{version.group(1)}" in body[:200].decode()
    assert (ASSETS / "chart.js-LICENSE.md").read_text().startswith("The MIT License")
