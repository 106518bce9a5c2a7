"""GET /v1/instances and PATCH /v1/instances/{name}: a number's send profile and policy (docs/sending-policy.md)."""

from __future__ import annotations

import pytest

from messaging.models import Instance
from tests.conftest import add_instance


@pytest.fixture
def shop(alice):
    return add_instance(alice.project, "shop-1", profile="unofficial")


def test_a_new_instance_is_unofficial(alice):
    from messaging import operators

    operators.add_instance("fresh", alice.project.pk)
    assert Instance.objects.get(name="fresh").send_profile == "unofficial"


def test_the_list_shows_each_numbers_profile_policy_and_health(alice, shop):
    [row] = alice.client().get("/v1/instances").json()["data"]
    assert row["sendProfile"] == "unofficial" and row["healthState"] == "healthy"
    assert row["sendPolicy"]["hourly_start"] == 20 and row["sendPolicy"]["daily_start"] == 50
    assert row["sendPolicyOverrides"] == {}


def test_patch_sets_the_profile_and_overrides(alice, shop):
    answer = alice.client().patch("/v1/instances/shop-1", {"sendPolicy": {"hourly_max": 60, "gap_min_seconds": 8}},
                                  format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["sendPolicy"]["hourly_max"] == 60
    assert answer.json()["sendPolicyOverrides"] == {"hourly_max": 60, "gap_min_seconds": 8.0}
    # A null drops one override; the rest stay.
    answer = alice.client().patch("/v1/instances/shop-1", {"sendPolicy": {"hourly_max": None}}, format="json")
    assert answer.json()["sendPolicyOverrides"] == {"gap_min_seconds": 8.0}
    # A new profile keeps only the overrides it knows.
    answer = alice.client().patch("/v1/instances/shop-1", {"sendProfile": "official"}, format="json")
    assert answer.status_code == 200
    shop.refresh_from_db()
    assert (shop.send_profile, shop.send_policy) == ("official", {})
    assert answer.json()["sendPolicy"]["pair_gap_seconds"] == 6.0


@pytest.mark.parametrize(("body", "field"), [
    ({"sendProfile": "fast"}, "sendProfile"),
    ({"sendPolicy": {"hourly_max": -5}}, "hourly_max"),
    ({"sendPolicy": {"warp": 1}}, "warp"),
    ({"sendPolicy": "fast"}, "sendPolicy"),
    ({"colour": "red"}, "colour"),
])
def test_bad_input_is_a_clear_error_and_changes_nothing(alice, shop, body, field):
    answer = alice.client().patch("/v1/instances/shop-1", body, format="json")
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and field in error["details"]["fields"]
    shop.refresh_from_db()
    assert (shop.send_profile, shop.send_policy) == ("unofficial", {})


def test_another_projects_or_pilot_status_instance_is_404(alice, carol):
    add_instance(carol.project, "carol-1", profile="unofficial")
    add_instance(None, "shared-1", profile="unofficial")
    for name in ("carol-1", "shared-1", "nope"):
        answer = alice.client().patch(f"/v1/instances/{name}", {"sendProfile": "official"}, format="json")
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
    assert set(Instance.objects.values_list("send_profile", flat=True)) == {"unofficial"}


def test_a_test_key_cannot_change_a_number(alice, shop):
    answer = alice.client(live=False).patch("/v1/instances/shop-1", {"sendProfile": "official"}, format="json")
    assert answer.status_code == 404
    shop.refresh_from_db()
    assert shop.send_profile == "unofficial"


def _admin_form(**changes):
    return {"name": "admin-made", "priority": "100", "connection_state": "open", "created_at_0": "2026-12-01",
            "created_at_1": "10:00:00", "send_profile": "unofficial", "health_state": "healthy", "send_policy": "",
            **changes}


def test_admin_edits_the_profile_and_checks_the_overrides(admin_client):
    response = admin_client.post("/admin/messaging/instance/add/", _admin_form(send_policy='{"hourly_max": -1}'))
    assert response.status_code == 200 and b"hourly_max must be" in response.content
    assert not Instance.objects.filter(name="admin-made").exists()
    response = admin_client.post("/admin/messaging/instance/add/",
                                 _admin_form(send_profile="official", send_policy='{"rate_per_second": 40}'))
    assert response.status_code == 302, response.content.decode()[:2000]
    made = Instance.objects.get(name="admin-made")
    assert (made.send_profile, made.send_policy) == ("official", {"rate_per_second": 40.0})


def test_admin_shows_what_a_number_is_sending(admin_client, alice, shop):
    from django.utils import timezone

    from messaging.models import SendSchedule

    assert b"no send yet" in admin_client.get(f"/admin/messaging/instance/{shop.pk}/change/").content
    SendSchedule.objects.create(instance=shop, first_send_at=timezone.now(), hour_sent=3, day_sent=7, day_cold=2)
    page = admin_client.get(f"/admin/messaging/instance/{shop.pk}/change/").content.decode()
    assert "this hour 3, today 7 (2 cold contacts)" in page
