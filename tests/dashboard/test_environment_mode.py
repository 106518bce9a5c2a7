"""The dashboard shows one environment at a time (issue 45 §1): LIVE by default, TEST after the switch (as
Stripe's test mode), never both; an object of the other environment answers 404, as another project's does,
and a bulk job resends only the environment it was started in."""

from __future__ import annotations

import pytest
from django.test import Client

from callbacks.models import Delivery, WebhookEndpoint
from dashboard import bulk
from dashboard.models import BulkResendJob
from messaging import opt_ins
from messaging.models import DeadLetter, Environment, Message
from tests.messaging.test_sandbox import failed

TEST_MARK = b"TEST mode"


@pytest.fixture
def worlds(alice, alice_instance):
    live = failed(alice, alice_instance, Environment.LIVE)
    test = failed(alice, alice_instance, Environment.TEST, to=alice.project.test_number)
    opt_ins.record(alice.project, live.message.to, "form", environment=Environment.LIVE)
    opt_ins.record(alice.project, alice.project.test_number, "dev", environment=Environment.TEST)
    return {Environment.LIVE: live, Environment.TEST: test}


@pytest.fixture
def member(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


def switch(member: Client, alice, environment: str) -> None:
    response = member.post(f"/dashboard/p/{alice.project.pk}/environment", {"environment": environment})
    assert response.status_code == 302, response.content


def pages(alice, entry: DeadLetter) -> dict[str, str]:
    p = alice.project.pk
    return {
        "detail": f"/dashboard/p/{p}/dead-letters/{entry.pk}/",
        "status": f"/dashboard/p/{p}/messages/{entry.message_id}/status.json",
    }


def test_live_is_the_default_and_test_objects_are_404(member, alice, worlds):
    live, test = worlds[Environment.LIVE], worlds[Environment.TEST]
    listing = member.get(f"/dashboard/p/{alice.project.pk}/dead-letters/")
    assert live.message.to.encode() in listing.content and alice.project.test_number.encode() not in listing.content
    assert TEST_MARK not in listing.content
    for url in pages(alice, live).values():
        assert member.get(url).status_code == 200, url
    for url in pages(alice, test).values():
        assert member.get(url).status_code == 404, url


def test_the_switch_shows_the_test_world_alone(member, alice, worlds):
    live, test = worlds[Environment.LIVE], worlds[Environment.TEST]
    switch(member, alice, Environment.TEST)
    listing = member.get(f"/dashboard/p/{alice.project.pk}/dead-letters/")
    assert alice.project.test_number.encode() in listing.content and live.message.to.encode() not in listing.content
    assert TEST_MARK in listing.content
    overview = member.get(f"/dashboard/p/{alice.project.pk}/")
    assert overview.status_code == 200 and TEST_MARK in overview.content
    for url in pages(alice, test).values():
        assert member.get(url).status_code == 200, url
    for url in pages(alice, live).values():
        assert member.get(url).status_code == 404, url
    switch(member, alice, Environment.LIVE)
    assert member.get(pages(alice, live)["detail"]).status_code == 200


def test_an_unknown_environment_is_refused(member, alice, worlds):
    response = member.post(f"/dashboard/p/{alice.project.pk}/environment", {"environment": "STAGING"})
    assert response.status_code == 400
    assert member.get(pages(alice, worlds[Environment.LIVE])["detail"]).status_code == 200


def test_actions_reach_only_the_shown_environment(member, alice, worlds):
    live = worlds[Environment.LIVE]
    switch(member, alice, Environment.TEST)
    p = alice.project.pk
    assert member.post(f"/dashboard/p/{p}/dead-letters/{live.pk}/resend", {"to": alice.project.test_number}).status_code == 404
    assert member.post(f"/dashboard/p/{p}/dead-letters/{live.pk}/dismiss").status_code == 404
    live.refresh_from_db()
    assert live.status == "OPEN"


def test_a_form_from_the_other_environment_does_nothing(member, alice, worlds):
    """A page left open in TEST mode while another tab switched to LIVE: its form says TEST, and is refused."""
    live = worlds[Environment.LIVE]
    response = member.post(f"/dashboard/p/{alice.project.pk}/dead-letters/bulk-resend",
                           {"scope": "all", "environment": Environment.TEST})
    assert response.status_code == 400
    assert not BulkResendJob.objects.exists()
    live.refresh_from_db()
    assert live.status == "OPEN"


def test_a_bulk_resend_in_test_mode_resends_test_entries_only(member, alice, worlds):
    live, test = worlds[Environment.LIVE], worlds[Environment.TEST]
    switch(member, alice, Environment.TEST)
    response = member.post(f"/dashboard/p/{alice.project.pk}/dead-letters/bulk-resend",
                           {"scope": "all", "environment": Environment.TEST})
    job = BulkResendJob.objects.get()
    assert response.status_code == 302 and job.environment == Environment.TEST and job.total == 1
    bulk.run(job.pk)
    live.refresh_from_db()
    test.refresh_from_db()
    assert (live.status, test.status) == ("OPEN", "RESENT")
    # ticked ids of the other environment are not part of a job
    job2 = bulk.start(alice.project, None, "dashboard:bob", ids=[live.pk], environment=Environment.TEST)
    assert job2.total == 0
    # the job's page belongs to its environment
    switch(member, alice, Environment.LIVE)
    assert member.get(f"/dashboard/p/{alice.project.pk}/bulk/{job.pk}/").status_code == 404


def test_the_webhooks_page_shows_the_modes_endpoints(member, alice, worlds):
    body = {"url": "http://127.0.0.1:9/hook", "eventTypes": ["message.status"]}
    live_id = alice.client().post("/v1/webhook-endpoints", body | {"description": "live-hook"}, format="json").json()["id"]
    test_id = alice.client(live=False).post("/v1/webhook-endpoints", body | {"description": "test-hook"},
                                            format="json").json()["id"]
    live_delivery = Delivery.objects.create(endpoint=WebhookEndpoint.objects.get(pk=live_id), event_type="message.status",
                                            source="event:1", payload={}, status="FAILED")
    page = member.get(f"/dashboard/p/{alice.project.pk}/webhooks/")
    assert b"live-hook" in page.content and b"test-hook" not in page.content
    switch(member, alice, Environment.TEST)
    page = member.get(f"/dashboard/p/{alice.project.pk}/webhooks/")
    assert b"test-hook" in page.content and b"live-hook" not in page.content
    p = alice.project.pk
    assert member.post(f"/dashboard/p/{p}/webhooks/deliveries/{live_delivery.pk}/replay").status_code == 404
    assert member.post(f"/dashboard/p/{p}/webhooks/{live_id}/replay-failed", {"since": "2020-01-01T00:00"}).status_code == 404
    live_delivery.refresh_from_db()
    assert live_delivery.status == "FAILED"
    assert Message.objects.filter(environment=Environment.TEST).count() == 1
    assert test_id
