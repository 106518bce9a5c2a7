"""The health governor in Django admin: each number's health history inline, and the override actions, logged with
the operator's username."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from messaging import governor
from messaging.models import Instance, InstanceHealthEvent
from tests.conftest import add_instance


@pytest.fixture
def number(alice):
    return add_instance(alice.project, "alice-phone", priority=10, profile="unofficial")


def test_the_override_action_sets_the_state_and_logs_the_operator(ops, number):
    number.refresh_from_db()
    governor.connection(number, "close", 403, number.set_connection_state("close"))  # banned: restricted
    response = ops.post("/admin/messaging/instance/", {"action": "set_health_healthy",
                                                       "_selected_action": [number.pk]}, follow=True)
    assert response.status_code == 200 and b"Health set to healthy for 1 instance(s): alice-phone" in response.content
    number.refresh_from_db()
    assert number.health_state == "healthy" and number.health_override_until > timezone.now()
    latest = InstanceHealthEvent.objects.filter(instance=number).first()
    assert latest is not None
    assert (latest.from_state, latest.to_state, latest.reason, latest.actor) == (
        "restricted", "healthy", "operator", "operator:ops")


def test_every_state_has_an_action(ops, number):
    for state in ("resting", "at_risk", "restricted", "healthy"):
        ops.post("/admin/messaging/instance/", {"action": f"set_health_{state}", "_selected_action": [number.pk]})
        assert Instance.objects.get(pk=number.pk).health_state == state
    assert [e.to_state for e in InstanceHealthEvent.objects.filter(instance=number).order_by("at", "id")] == [
        "resting", "at_risk", "restricted", "healthy"]


def test_the_change_page_shows_the_health_history_and_does_not_edit_the_state(ops, number):
    number.refresh_from_db()
    governor.connection(number, "close", 401, number.set_connection_state("close"))
    page = ops.get(f"/admin/messaging/instance/{number.pk}/change/").content.decode()
    assert "health history" in page.lower() and "logout" in page and "governor" in page
    assert 'name="health_state"' not in page


def test_staff_who_may_only_view_get_no_override_action(db, number):
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user("viewer", "v@example.com", "viewer-password-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_instance"))
    client = Client()
    client.force_login(user)
    client.post("/admin/messaging/instance/", {"action": "set_health_resting", "_selected_action": [number.pk]})
    assert Instance.objects.get(pk=number.pk).health_state == "healthy"
    assert not InstanceHealthEvent.objects.filter(instance=number).exists()
