"""The message timeline a page at a time (issue 22): GET /v1/messages/{id} carries the latest lines
and `eventsNextCursor`; GET /v1/messages/{id}/events pages through the rest, newest first."""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

from django.utils import timezone

from messaging import timeline
from messaging.models import Message, MessageEvent
from tests.messaging.test_read_endpoints import make_message


def with_lines(actor: Any, instance: Any, count: int) -> Message:
    message = make_message(actor, instance)
    base = timezone.now() - timedelta(hours=1)
    MessageEvent.objects.bulk_create(
        MessageEvent(message=message, kind="WAITING", detail={"n": i}, created_at=base + timedelta(seconds=i))
        for i in range(count)
    )
    return message


def test_a_short_timeline_comes_whole_with_the_message(alice: Any, alice_instance: Any) -> None:
    message = with_lines(alice, alice_instance, 3)
    body = alice.client().get(f"/v1/messages/{message.pk}").json()
    assert [e["detail"]["n"] for e in body["events"]] == [0, 1, 2]  # oldest first, as before
    assert body["eventsNextCursor"] is None


def test_a_long_timeline_is_paged(alice: Any, alice_instance: Any) -> None:
    message = with_lines(alice, alice_instance, timeline.INLINE + 30)
    body = alice.client().get(f"/v1/messages/{message.pk}").json()
    # The latest INLINE lines, oldest first, and a cursor for the ones before them.
    assert [e["detail"]["n"] for e in body["events"]] == list(range(30, timeline.INLINE + 30))
    cursor = body["eventsNextCursor"]
    assert cursor

    seen = []
    while cursor:
        page = alice.client().get(f"/v1/messages/{message.pk}/events", {"cursor": cursor, "limit": 12}).json()
        assert len(page["data"]) <= 12
        seen += [e["detail"]["n"] for e in page["data"]]
        cursor = page["nextCursor"]
    assert seen == list(reversed(range(30)))  # newest first, every older line once

    first = alice.client().get(f"/v1/messages/{message.pk}/events", {"limit": 5}).json()
    assert [e["detail"]["n"] for e in first["data"]] == [79, 78, 77, 76, 75]


def test_the_events_of_another_projects_message_are_404(alice: Any, alice_instance: Any, carol: Any) -> None:
    message = with_lines(alice, alice_instance, 2)
    response = carol.client().get(f"/v1/messages/{message.pk}/events")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_bad_event_page_parameters_are_400(alice: Any, alice_instance: Any) -> None:
    message = with_lines(alice, alice_instance, 2)
    for params in ({"limit": 0}, {"limit": 201}, {"cursor": "!!!"}, {"unknown": "1"},
                   {"cursor": base64.urlsafe_b64encode(b"2024-01-01T00:00:00+00:00|x").decode()}):
        response = alice.client().get(f"/v1/messages/{message.pk}/events", params)
        assert response.status_code == 400, (params, response.content)
        assert response.json()["error"]["code"] == "invalid_request"


def test_the_schema_lists_the_events_route(db: Any, client: Any) -> None:
    spec = client.get("/v1/schema/", HTTP_ACCEPT="application/json").json()
    route = spec["paths"]["/v1/messages/{message_id}/events"]["get"]
    assert {"200", "400", "401", "404"} <= set(route["responses"])
    detail = spec["components"]["schemas"]["MessageDetail"]
    assert "eventsNextCursor" in detail["properties"]
