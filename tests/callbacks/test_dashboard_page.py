"""The dashboard's webhooks page: endpoints (a disabled one says so), recent attempts, replays; a
member of another project gets 404."""

from __future__ import annotations

from django.test import Client
from django.utils import timezone

from callbacks.models import Delivery, DeliveryAttempt, WebhookEndpoint
from messaging import operators


def signed_in(username: str) -> Client:
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return client


def test_the_page_lists_endpoints_attempts_and_replays_a_failed_delivery(alice, bob):
    live = WebhookEndpoint.objects.create(project=alice.project, url="https://hooks.example.com/a", event_types=["message.status"])
    WebhookEndpoint.objects.create(
        project=alice.project, url="https://hooks.example.com/b", event_types=["opt_in.revoked"], enabled=False,
        disabled_at=timezone.now(), disabled_reason="Every attempt failed since 2026-11-26",
    )
    failed = Delivery.objects.create(
        endpoint=live, event_type="message.status", source="event:1", status="FAILED", attempts=8,
        payload={"type": "message.status", "data": {"status": "READ"}},
    )
    DeliveryAttempt.objects.create(delivery=failed, url=live.url, response_status=503, response_body="busy", duration_ms=12)

    client = signed_in("bob")
    page = client.get(f"/dashboard/p/{alice.project.pk}/webhooks/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "https://hooks.example.com/a" in html and "HTTP 503" in html and failed.webhook_id in html
    assert "disabled" in html and "Every attempt failed since 2026-11-26" in html

    replayed = client.post(f"/dashboard/p/{alice.project.pk}/webhooks/deliveries/{failed.pk}/replay")
    assert replayed.status_code == 302
    failed.refresh_from_db()
    assert failed.status == "PENDING" and failed.attempts == 0

    Delivery.objects.filter(pk=failed.pk).update(status="FAILED")
    since = client.post(f"/dashboard/p/{alice.project.pk}/webhooks/{live.pk}/replay-failed", {"since": "2020-01-01T00:00"})
    assert since.status_code == 302
    failed.refresh_from_db()
    assert failed.status == "PENDING"
    assert client.get(f"/dashboard/p/{alice.project.pk}/webhooks/{live.pk}/replay-failed").status_code == 405


def test_another_projects_member_gets_404(alice, carol):
    operators.create_member(carol.project.pk, "dave", "dave-password-123")
    endpoint = WebhookEndpoint.objects.create(project=alice.project, url="https://hooks.example.com/a", event_types=["message.status"])
    delivery = Delivery.objects.create(endpoint=endpoint, event_type="message.status", source="event:1", status="FAILED", payload={})
    client = signed_in("dave")
    assert client.get(f"/dashboard/p/{alice.project.pk}/webhooks/").status_code == 404
    assert client.post(f"/dashboard/p/{alice.project.pk}/webhooks/deliveries/{delivery.pk}/replay").status_code == 404
    assert client.post(f"/dashboard/p/{carol.project.pk}/webhooks/deliveries/{delivery.pk}/replay").status_code == 404
    delivery.refresh_from_db()
    assert delivery.status == "FAILED"
