"""The dead letter page shows a long timeline a page at a time (issue 22)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone

from messaging import timeline
from messaging.models import MessageEvent
from tests.dashboard.test_views import bob_browser, entry, opted_in  # noqa: F401 (fixtures)


def test_a_long_timeline_is_shown_a_page_at_a_time(bob_browser: Any, entry: Any) -> None:  # noqa: F811
    message = entry.message
    base = timezone.now() - timedelta(hours=1)
    MessageEvent.objects.bulk_create(
        MessageEvent(message=message, kind="WAITING", detail={"why": f"hold number {i}"}, created_at=base + timedelta(seconds=i))
        for i in range(timeline.INLINE + 10)
    )
    total = MessageEvent.objects.filter(message=message).count()
    url = reverse("dashboard:dead_letter", args=[entry.project_id, entry.pk])
    page = bob_browser.get(url).content.decode()
    assert page.count('<li class="ev ') == timeline.INLINE
    assert f"{total} lines" in page
    assert "hold number 0<" not in page  # the oldest lines are on the next page
    older = re.search(r'href="\?before=([^"]+)" id="timeline-older"', page)
    assert older
    second = bob_browser.get(f"{url}?before={older.group(1)}").content.decode()
    assert "hold number 0<" in second and 'id="timeline-latest"' in second
    # A tampered cursor shows the latest lines, not an error.
    assert bob_browser.get(f"{url}?before=%21%21").status_code == 200
