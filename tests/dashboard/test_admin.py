"""Operations in Django admin: dead-letter actions, message search and timeline, reprocess, audit."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from ingestion.models import IngestionEvent
from messaging import opt_ins
from messaging.models import DeadLetter, EventKind, Message, Status
from tests.messaging.test_resend import RECIPIENT, failed_message


@pytest.fixture
def entry(alice, alice_instance) -> DeadLetter:
    opt_ins.record(alice.project, RECIPIENT, "checkout")
    return failed_message(alice)


def test_the_force_resend_action_resends_and_records_the_operator(ops, entry):
    response = ops.post("/admin/messaging/deadletter/",
                        {"action": "force_resend", "_selected_action": [entry.pk]}, follow=True)

    assert response.status_code == 200
    assert b"1 resent" in response.content
    entry.refresh_from_db()
    assert entry.status == "RESENT" and entry.resolved_by == "admin:ops"
    assert Message.objects.get(pk=entry.message_id).status == Status.QUEUED


def test_the_force_resend_action_reports_refusals(ops, alice, entry):
    opt_ins.revoke(alice.project, RECIPIENT, None)
    response = ops.post("/admin/messaging/deadletter/",
                        {"action": "force_resend", "_selected_action": [entry.pk]}, follow=True)
    assert b"opt_in_required" in response.content
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


def test_the_dismiss_action(ops, entry):
    ops.post("/admin/messaging/deadletter/", {"action": "dismiss", "_selected_action": [entry.pk]})
    entry.refresh_from_db()
    assert entry.status == "DISMISSED" and entry.resolved_by == "admin:ops"


def test_dead_letters_filter_across_projects(ops, entry, carol):
    response = ops.get("/admin/messaging/deadletter/", {"status__exact": "OPEN", "reason__exact": "INVALID_RECIPIENT"})
    assert response.status_code == 200 and RECIPIENT.encode() in response.content
    assert ops.get(f"/admin/messaging/deadletter/{entry.pk}/change/").status_code == 200


@pytest.mark.parametrize("term", ["id", "to", "evolution"])
def test_messages_are_found_by_id_recipient_and_evolution_id(ops, entry, term):
    message = Message.objects.get(pk=entry.message_id)
    Message.objects.filter(pk=message.pk).update(evolution_message_id="3EB0ABCDEF")
    query = {"id": str(message.pk), "to": RECIPIENT, "evolution": "3EB0ABCDEF"}[term]
    response = ops.get("/admin/messaging/message/", {"q": query})
    assert response.status_code == 200
    assert str(message.pk).encode() in response.content


def test_a_message_page_shows_its_timeline(ops, entry):
    response = ops.get(f"/admin/messaging/message/{entry.message_id}/change/")
    assert response.status_code == 200
    for kind in (b"Accepted", b"Failed", b"Dead-lettered"):
        assert kind in response.content


def test_a_message_page_cannot_write_the_message(ops, entry):
    """Every field is read-only, but a saved change form would still write the whole row back, its status as read
    at the start of the request over a move a worker or a receipt made meanwhile: a status changes only through
    messaging.lifecycle."""
    url = f"/admin/messaging/message/{entry.message_id}/change/"
    page = ops.get(url)
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert ops.post(url, {}).status_code == 403


def test_the_resend_audit_lists_who_resent_what(ops, entry):
    ops.post("/admin/messaging/deadletter/", {"action": "force_resend", "_selected_action": [entry.pk]})
    response = ops.get("/admin/messaging/messageevent/", {"kind__exact": EventKind.RESENT})
    assert response.status_code == 200
    assert b"admin:ops" in response.content and str(entry.message_id).encode() in response.content


def test_reprocess_applies_unprocessed_events(ops, alice_instance):
    event = IngestionEvent.objects.create(
        dedup_key="a" * 64, channel="WEBHOOK", event="connection.update", instance_name=alice_instance.name,
        payload={"event": "connection.update", "instance": alice_instance.name, "data": {"state": "close"}},
    )
    response = ops.post("/admin/ingestion/ingestionevent/",
                        {"action": "reprocess", "_selected_action": [event.pk]}, follow=True)
    assert b"Reprocessed" in response.content
    event.refresh_from_db()
    assert event.processed_at is not None
    alice_instance.refresh_from_db()
    assert alice_instance.connection_state == "close"


# ---- who may run the actions (issue 21): view permission shows the rows, change runs the actions ----------

def _staff(username: str, *codenames: str) -> Client:
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(username, f"{username}@example.com", f"{username}-password-123",
                                                is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(db) -> Client:
    # Staff who may look at everything and change nothing.
    return _staff("viewer", "view_deadletter", "view_apikey", "view_ingestionevent")


@pytest.fixture
def unprocessed(alice_instance) -> IngestionEvent:
    return IngestionEvent.objects.create(
        dedup_key="b" * 64, channel="WEBHOOK", event="connection.update", instance_name=alice_instance.name,
        payload={"event": "connection.update", "instance": alice_instance.name, "data": {"state": "close"}},
    )


ACTIONS = [
    ("/admin/messaging/deadletter/", "force_resend"),
    ("/admin/messaging/deadletter/", "dismiss"),
    ("/admin/messaging/apikey/", "revoke"),
    ("/admin/ingestion/ingestionevent/", "reprocess"),
]


def _target(url: str, alice, entry, unprocessed) -> int:
    from messaging.models import ApiKey

    if "deadletter" in url:
        return entry.pk
    if "apikey" in url:
        return ApiKey.objects.filter(project=alice.project).order_by("pk").first().pk
    return unprocessed.pk


def _snapshot(alice, entry, unprocessed) -> tuple:
    from messaging.models import ApiKey

    return (
        tuple(DeadLetter.objects.filter(pk=entry.pk).values_list("status", "resolved_by")),
        tuple(ApiKey.objects.filter(project=alice.project).order_by("pk").values_list("revoked_at", flat=True)),
        tuple(IngestionEvent.objects.filter(pk=unprocessed.pk).values_list("processed_at", flat=True)),
    )


@pytest.mark.parametrize("url,action", ACTIONS)
def test_view_only_staff_neither_see_nor_run_the_actions(viewer, alice, entry, unprocessed, url, action):
    listing = viewer.get(url)
    assert listing.status_code == 200
    assert f'value="{action}"'.encode() not in listing.content
    before = _snapshot(alice, entry, unprocessed)

    response = viewer.post(url, {"action": action, "_selected_action": [_target(url, alice, entry, unprocessed)]})

    assert response.status_code < 500
    assert _snapshot(alice, entry, unprocessed) == before


@pytest.mark.parametrize("url,action", ACTIONS)
def test_staff_with_change_permission_see_and_run_the_actions(alice, entry, unprocessed, url, action):
    editor = _staff("editor", "view_deadletter", "change_deadletter", "view_apikey", "change_apikey",
                    "view_ingestionevent", "change_ingestionevent")
    assert f'value="{action}"'.encode() in editor.get(url).content
    before = _snapshot(alice, entry, unprocessed)

    editor.post(url, {"action": action, "_selected_action": [_target(url, alice, entry, unprocessed)]})

    assert _snapshot(alice, entry, unprocessed) != before
