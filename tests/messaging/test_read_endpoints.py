"""GET /v1/messages, /v1/messages/{id}, /v1/instances, opt-ins: filters, cursors, tenant isolation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from messaging import opt_ins
from messaging.models import Message, OptIn
from tests.conftest import add_instance

RECIPIENT = "+5511988887777"


def make_message(actor, instance, *, status="QUEUED", category="UTILITY", to=RECIPIENT, created=None):
    return Message.objects.create(
        project=actor.project, environment="LIVE", category=category, to=to, template="hi", text="hi",
        instance=instance, deliver_until=timezone.now() + timedelta(hours=1), status=status,
        created_at=created or timezone.now(),
    )


def test_the_detail_shows_status_and_timeline(alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "form")
    sent = alice.client().post(
        "/v1/messages/send", {"to": RECIPIENT, "category": "UTILITY", "text": "hi"}, format="json"
    ).json()
    detail = alice.client().get(f"/v1/messages/{sent['id']}").json()
    assert detail["id"] == sent["id"]
    assert detail["status"] == "QUEUED"
    assert detail["failureReason"] is None
    assert detail["attempts"] == 0
    assert detail["instance"] == "alice-main"
    assert [e["type"] for e in detail["events"]] == ["ACCEPTED"]


def test_another_projects_message_is_404(alice, alice_instance, carol):
    message = make_message(alice, alice_instance)
    response = carol.client().get(f"/v1/messages/{message.pk}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_an_unknown_or_malformed_id_is_404_json(alice):
    assert alice.client().get("/v1/messages/7d4c0e38-0000-4000-8000-000000000000").status_code == 404
    response = alice.client().get("/v1/messages/not-a-uuid")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_the_list_is_newest_first_with_a_cursor(alice, alice_instance, carol):
    base = timezone.now() - timedelta(minutes=10)
    made = [make_message(alice, alice_instance, created=base + timedelta(seconds=i)) for i in range(5)]
    add_instance(carol.project, "carol-main")
    make_message(carol, carol.project.instances.get(), created=base)

    first = alice.client().get("/v1/messages", {"limit": 2}).json()
    assert [m["id"] for m in first["data"]] == [str(made[4].pk), str(made[3].pk)]
    second = alice.client().get("/v1/messages", {"limit": 2, "cursor": first["nextCursor"]}).json()
    assert [m["id"] for m in second["data"]] == [str(made[2].pk), str(made[1].pk)]
    third = alice.client().get("/v1/messages", {"limit": 2, "cursor": second["nextCursor"]}).json()
    assert [m["id"] for m in third["data"]] == [str(made[0].pk)]
    assert third["nextCursor"] is None


def test_the_list_filters(alice, alice_instance):
    make_message(alice, alice_instance, status="FAILED", category="OTP")
    make_message(alice, alice_instance, status="READ", to="+5511977776666")
    make_message(alice, alice_instance, status="READ")
    client = alice.client()
    assert len(client.get("/v1/messages", {"status": "READ"}).json()["data"]) == 2
    assert len(client.get("/v1/messages", {"category": "OTP"}).json()["data"]) == 1
    assert len(client.get("/v1/messages", {"to": "+5511977776666"}).json()["data"]) == 1
    later = (timezone.now() + timedelta(minutes=1)).isoformat()
    assert client.get("/v1/messages", {"createdAfter": later}).json()["data"] == []


@pytest.mark.parametrize("params", [{"status": "NOPE"}, {"cursor": "%%%"}, {"limit": 0}, {"bogus": 1}])
def test_bad_list_parameters_are_400(alice, params):
    response = alice.client().get("/v1/messages", params)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"


def test_a_tampered_cursor_is_400_not_500(alice):
    import base64

    for raw in ("2024-01-01T00:00:00+00:00|abc", "2024-01-01T00:00:00+00:00|", "not-a-date|x"):
        cursor = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
        response = alice.client().get("/v1/messages", {"cursor": cursor})
        assert response.status_code == 400, (raw, response.content)
        assert response.json()["error"]["details"] == {"fields": {"cursor": ["Invalid cursor."]}}


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/dead-letters"])
def test_empty_list_parameters_mean_no_filter(alice, alice_instance, path):
    make_message(alice, alice_instance)
    response = alice.client().get(f"{path}?status=&category=&cursor=")
    assert response.status_code == 200, response.content
    if path == "/v1/messages":
        assert len(response.json()["data"]) == 1


def test_instances_lists_only_the_projects_own(alice, alice_instance, official_instance, carol):
    add_instance(carol.project, "carol-main")
    data = alice.client().get("/v1/instances").json()["data"]
    assert [i["name"] for i in data] == ["alice-main"]
    assert data[0]["state"] == "open"


def test_opt_ins_are_recorded_and_revoked_with_history(alice):
    client = alice.client()
    created = client.post("/v1/opt-ins", {"phone": RECIPIENT, "source": "checkout"}, format="json")
    assert created.status_code == 201
    assert created.json()["phone"] == RECIPIENT
    again = client.post("/v1/opt-ins", {"phone": RECIPIENT, "source": "other"}, format="json")
    assert again.status_code == 201
    assert OptIn.objects.filter(project=alice.project).count() == 1

    revoked = client.delete("/v1/opt-ins/%2B5511988887777")
    assert revoked.status_code == 200
    assert revoked.json()["revokedAt"] is not None
    assert client.delete("/v1/opt-ins/%2B5511988887777").status_code == 404

    client.post("/v1/opt-ins", {"phone": RECIPIENT, "source": "again"}, format="json")
    history = OptIn.objects.filter(project=alice.project, phone=RECIPIENT).order_by("created_at")
    assert [(o.source, o.revoked_at is not None) for o in history] == [("checkout", True), ("again", False)]


def test_a_bad_opt_in_is_400_and_stores_nothing(alice):
    response = alice.client().post("/v1/opt-ins", {"phone": "123", "source": "x"}, format="json")
    assert response.status_code == 400
    assert "phone" in response.json()["error"]["details"]["fields"]
    assert OptIn.objects.count() == 0


def test_revoking_another_projects_opt_in_is_404(alice, carol):
    opt_ins.record(alice.project, RECIPIENT, "form")
    assert carol.client().delete(f"/v1/opt-ins/{RECIPIENT}").status_code == 404
    assert OptIn.objects.get().revoked_at is None


def test_unknown_urls_answer_json_404(alice):
    response = alice.client().get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_huge_body_is_413(alice, alice_instance):
    response = alice.client().post(
        "/v1/messages/send", data='{"text": "' + "x" * 200_000 + '"}', content_type="application/json"
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert Message.objects.count() == 0


def test_the_schema_and_docs_are_served(db, client):
    schema = client.get("/v1/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    spec = schema.json()
    send = spec["paths"]["/v1/messages/send"]["post"]
    assert {"202", "400", "401", "403", "409", "415", "422", "429"} <= set(send["responses"])
    assert "opt_in_required" in send["responses"]["422"]["description"]
    request = spec["components"]["schemas"][send["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]]
    # The per-category default and limit of deliverUntil are part of the published contract.
    assert "OTP +2 min (at most +10 min)" in request["properties"]["deliverUntil"]["description"]
    assert client.get("/v1/docs/").status_code == 200
