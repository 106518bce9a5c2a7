"""The dashboard's Webhooks page in a real browser, on the real stack (issue 23): callbacks that really
failed (the receiver was down) show their attempts; once the receiver is back, "Replay failed
deliveries" delivers them, and the page shows the successful attempts. Screenshots in
artifacts/screenshots/."""

from __future__ import annotations

import pytest
import requests

from callbacks.models import Delivery
from messaging import opt_ins
from messaging.models import Message
from tests.dashboard.conftest import screenshot
from tests.dashboard.test_browser import log_in
from tests.support.receiver import Receiver
from tests.support.simulator import wait_until

pytestmark = pytest.mark.stack

RECIPIENT = "+5511988887777"
FAST = {
    "CALLBACKS_RELAY_SECONDS": "1",
    "CALLBACKS_RETRY_SCHEDULE": "0,1",  # two quick attempts, then FAILED
    "CALLBACKS_CIRCUIT_FAILURES": "50",
    "RECONCILE_SECONDS": "3600",
    "STATUS_SYNC_SECONDS": "3600",
    "INSTANCE_POLL_SECONDS": "3600",
    "INGESTION_RECONCILE_SECONDS": "3600",
    "RETENTION_SECONDS": "3600",
}


def test_a_member_sees_failed_callbacks_and_replays_them(stack, simulator, alice, bob, alice_instance, browser_page):
    page = browser_page
    simulator.register(alice_instance, stack.webhook_url)
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {alice.live_key}"
    secret: dict[str, str] = {}
    receiver = Receiver(lambda: secret["value"])
    try:
        # given: an endpoint whose receiver is down, and a message that reaches READ
        created = api.post(
            f"{stack.web_url}/v1/webhook-endpoints", json={"url": receiver.url, "eventTypes": ["message.status"]}, timeout=10
        )
        assert created.status_code == 201, created.text
        secret["value"] = created.json()["secret"]
        stack.start_callbacks(FAST)
        opt_ins.record(alice.project, RECIPIENT, "checkout")
        sent = api.post(f"{stack.web_url}/v1/messages/send", json={"to": RECIPIENT, "category": "UTILITY", "text": "Hi"}, timeout=10)
        assert sent.status_code == 202, sent.text
        wait_until(lambda: Message.objects.filter(pk=sent.json()["id"], status="READ").exists(), timeout=30, message="READ")
        wait_until(
            lambda: Delivery.objects.count() >= 2 and not Delivery.objects.exclude(status="FAILED").exists(),
            timeout=30, message="every delivery FAILED",
        )
        failed = Delivery.objects.count()

        # when: bob opens the Webhooks page
        log_in(page, stack, "bob", "bob-password-123")
        page.get_by_role("link", name="Webhooks").click()
        page.wait_for_url(f"**/dashboard/p/{alice.project.pk}/webhooks/")
        # then: the endpoint, its failed deliveries and their refused attempts are shown
        assert page.get_by_role("heading", name=receiver.url).is_visible()
        assert page.locator("tr.delivery").count() == failed
        assert page.locator("tr.delivery", has_text="FAILED").count() == failed
        assert page.locator("ul.attempts li", has_text="NewConnectionError").count() == 2 * failed
        screenshot(page, "webhooks-failed")

        # when: the receiver is back and bob replays the failed deliveries
        receiver.set("ok")
        page.get_by_role("button", name="Replay failed deliveries").click()
        assert page.get_by_text(f"Replayed {failed} failed deliveries.").is_visible()

        # then: every callback arrives, signed, and the page shows the successful attempts
        wait_until(lambda: len(receiver.accepted()) == failed, timeout=30, message="every callback delivered")
        assert all(r.verified for r in receiver.accepted())
        wait_until(lambda: not Delivery.objects.exclude(status="SUCCEEDED").exists(), timeout=10, message="SUCCEEDED")
        page.reload()
        assert page.locator("tr.delivery", has_text="SUCCEEDED").count() == failed
        assert page.locator("ul.attempts li", has_text="HTTP 204").count() == failed
        screenshot(page, "webhooks-replayed")
    finally:
        receiver.stop()
        stack.stop_callbacks()
