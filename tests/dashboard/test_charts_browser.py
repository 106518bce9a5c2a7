"""The overview's two charts in a real browser (Debian's chromium through Playwright), served by Django's
live server on the test database: messages of several statuses over several hours are drawn as stacked bars
and delivery percentiles, by the vendored Chart.js, under the page's Content-Security-Policy.

No stack is needed (the charts only read Postgres), so this runs without gunicorn, the relay or the workers.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from messaging.models import Message, Status
from tests.conftest import add_instance
from tests.dashboard.conftest import screenshot

# hours ago → the statuses of the messages accepted then, with each delivered one's seconds to delivery
TRAFFIC: dict[int, list[tuple[str, float | None]]] = {
    1: [(Status.DELIVERED, 2.0), (Status.DELIVERED, 4.0), (Status.READ, 6.0), (Status.FAILED, None)],
    2: [(Status.QUEUED, None), (Status.SENT, None), (Status.DELIVERED, 30.0)],
    4: [(Status.SERVER_ACK, None), (Status.READ, 90.0), (Status.READ, 120.0), (Status.FAILED, None)],
    6: [(Status.DELIVERED, 8.0), (Status.SENDING, None)],
}
# the JS's colours of the statuses above (charts.js STATUS_COLOURS), as RGB
COLOURS = {
    Status.QUEUED: (0xd9, 0x77, 0x06), Status.SENDING: (0xfc, 0xd3, 0x4d), Status.SENT: (0x93, 0xc5, 0xfd),
    Status.SERVER_ACK: (0x1d, 0x4e, 0xd8), Status.DELIVERED: (0x4a, 0xde, 0x80), Status.READ: (0x15, 0x80, 0x3d),
    Status.FAILED: (0xb9, 0x1c, 0x1c),
}

# What the page's two Chart.js charts hold and how many of their elements are drawn (a bar of non-zero
# height, a point with a value), plus how many canvas pixels carry each status's colour.
CHART_STATE = """([colours]) => {
  const chart = (id) => Chart.getChart(document.getElementById(id));
  const bars = chart("chart-by-status"), lines = chart("chart-latency");
  const canvas = bars.canvas, ctx = canvas.getContext("2d");
  const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  const painted = {};
  for (const [status, rgb] of Object.entries(colours)) {
    let n = 0;
    for (let i = 0; i < pixels.length; i += 4) {
      if (pixels[i] === rgb[0] && pixels[i + 1] === rgb[1] && pixels[i + 2] === rgb[2] && pixels[i + 3] === 255) n++;
    }
    painted[status] = n;
  }
  const drawn = (c) => c.data.datasets.map((d, i) => ({
    label: d.label, data: d.data,
    drawn: c.getDatasetMeta(i).data.filter((el) => !el.skip && Number.isFinite(el.y)
      && (c.config.type !== "bar" || Math.abs(el.base - el.y) >= 1)).length,
  }));
  const box = (c) => ({ width: c.canvas.clientWidth, height: c.canvas.clientHeight });
  return { bars: drawn(bars), lines: drawn(lines), painted, barsBox: box(bars), linesBox: box(lines),
           labels: bars.data.labels };
}"""


def log_in(page, live_server) -> None:
    page.goto(f"{live_server.url}/dashboard/login/")
    page.get_by_label("Username").fill("bob")
    page.get_by_label("Password").fill("bob-password-123")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/dashboard/p/\d+/$"))


@pytest.fixture
def traffic(transactional_db, alice, carol) -> dict[str, int]:
    """alice's messages over the last hours (TRAFFIC), and carol's, which alice's charts must not show."""
    instance = add_instance(alice.project, "alice-main", priority=10)
    now = timezone.now()
    totals: dict[str, int] = {}
    for hours_ago, messages in TRAFFIC.items():
        # the middle of that hour, so a minute's drift of the clock keeps each message in its bucket
        created = now.replace(minute=30, second=0, microsecond=0) - timedelta(hours=hours_ago)
        for status, took in messages:
            Message.objects.create(
                project=alice.project, environment="LIVE", category="UTILITY", to="+5511988887777",
                template="hi", text="hi", instance=instance, deliver_until=created + timedelta(hours=1),
                status=status, created_at=created,
                delivered_at=created + timedelta(seconds=took) if took is not None else None,
            )
            totals[status] = totals.get(status, 0) + 1
    carols = add_instance(carol.project, "carol-main")
    for _ in range(20):
        Message.objects.create(
            project=carol.project, environment="LIVE", category="UTILITY", to="+5511988880000", template="hi",
            text="hi", instance=carols, deliver_until=now + timedelta(hours=1), status=Status.QUEUED,
            created_at=now - timedelta(hours=3),
        )
    return totals


def test_the_overview_draws_messages_per_hour_by_status_and_delivery_percentiles(
    live_server, bob, traffic, browser_page
):
    page = browser_page
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}"))
    outside: list[str] = []
    page.on("request", lambda request: None if request.url.startswith(live_server.url) else outside.append(request.url))

    hour_before = datetime.now(dt_timezone.utc).strftime("%H:00")
    log_in(page, live_server)
    page.locator("#charts[data-state=ready]").wait_for()
    screenshot(page, "overview-charts")

    state = page.evaluate(CHART_STATE, [{s: list(rgb) for s, rgb in COLOURS.items()}])
    hour_after = datetime.now(dt_timezone.utc).strftime("%H:00")

    # both canvases have a size
    for box in (state["barsBox"], state["linesBox"]):
        assert box["width"] > 200 and box["height"] > 150, box
    # 24 hours, labelled in UTC, the last one the current hour
    assert len(state["labels"]) == 24
    assert state["labels"][-1] in {hour_before, hour_after}
    # one stacked series per status, with a drawn bar for every hour that had such messages, and only those
    bars = {series["label"]: series for series in state["bars"]}
    for status in Status:
        expected = traffic.get(status.value, 0)
        assert sum(bars[status.label]["data"]) == expected, status
        hours_with_it = sum(1 for messages in TRAFFIC.values() if any(s == status for s, _ in messages))
        assert bars[status.label]["drawn"] == hours_with_it, status
        # and its colour is on the canvas exactly when it has a bar
        assert (state["painted"][status.value] > 20) == (expected > 0), (status, state["painted"])
    # carol's 20 queued messages are not alice's
    assert sum(bars["Queued"]["data"]) == 1
    # delivery percentiles: a point in each hour with a delivered (or read) message
    lines = {series["label"]: series for series in state["lines"]}
    assert set(lines) == {"p50", "p90", "p99"}
    for series in lines.values():
        assert series["drawn"] == 4, series
    p50 = [v for v in lines["p50"]["data"] if v is not None]
    assert p50 == [8.0, 105.0, 30.0, 4.0]  # 6, 4, 2 and 1 hours ago: oldest first
    # the charts' canvases describe themselves for screen readers
    assert "13 in all" in page.locator("#chart-by-status").get_attribute("aria-label")
    # everything came from this origin, with nothing refused by the page's policy and no script error
    assert outside == [] and problems == [], (outside, problems)


def test_the_page_says_when_the_charts_are_unavailable(live_server, bob, transactional_db, browser_page, settings):
    page = browser_page
    settings.DASHBOARD_CHART_TIMEOUT_MS = 200
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"],
                         dbname=db["NAME"]) as holder:
        holder.execute("SET lock_timeout = '5s'")

        def hold_the_messages_table(route) -> None:
            # Once the overview has rendered, another session takes the messages table: the charts' query
            # waits for it until the statement timeout cancels it.
            holder.execute("LOCK TABLE messaging_message IN ACCESS EXCLUSIVE MODE")
            route.continue_()

        page.route(re.compile(r".*/charts\.json$"), hold_the_messages_table)
        log_in(page, live_server)
        page.locator("#charts[data-state=error]").wait_for()
        holder.rollback()
    assert page.locator("#charts-note").inner_text() == (
        "Charts unavailable: The charts could not be computed just now; try again.")
    # the rest of the overview is there as ever
    assert page.get_by_role("heading", name="Today by lane and status").is_visible()
    screenshot(page, "overview-charts-unavailable")
