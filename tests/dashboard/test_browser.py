"""The customer dashboard in a real browser, on the real stack, with failures the simulator makes.

A member logs in, opens a dead letter produced by a real failure, fixes the cause, force-resends
and watches the message reach DELIVERED; a bulk resend runs in the background with its progress
bar; another project's member gets 404. Screenshots land in artifacts/screenshots/.
"""

from __future__ import annotations

import re

import pytest
import requests

from messaging import operators, opt_ins
from messaging.models import DeadLetter, EventKind, Message, Status
from tests.dashboard.conftest import screenshot
from tests.support.simulator import wait_until

pytestmark = pytest.mark.stack

RECIPIENT = "+5511988887777"
BULK_RECIPIENTS = ["+5511988880001", "+5511988880002", "+5511988880003"]
ARRIVED = (Status.DELIVERED, Status.READ)


def send(stack, actor, to: str, text: str = "Your order {{n}} has shipped") -> str:
    response = requests.post(
        f"{stack.web_url}/v1/messages/send",
        json={"to": to, "category": "UTILITY", "text": text, "variables": {"n": "1042"}},
        headers={"Authorization": f"Bearer {actor.live_key}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    return response.json()["id"]


def dead_letter_of(message_id: str) -> DeadLetter:
    return wait_until(lambda: DeadLetter.objects.filter(message_id=message_id).first(), timeout=30,
                      message=f"dead letter for {message_id}")


def log_in(page, stack, username: str, password: str) -> None:
    page.goto(f"{stack.web_url}/dashboard/login/")
    screenshot(page, "login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/dashboard/p/\d+/$"))


@pytest.fixture
def failing_recipient(stack, simulator, alice, alice_instance):
    """alice's instance is live on the simulator, but RECIPIENT is not on WhatsApp (yet)."""
    simulator.register(alice_instance, stack.webhook_url)
    simulator.faults(alice_instance.name, not_on_whatsapp=[RECIPIENT, *BULK_RECIPIENTS])
    for phone in [RECIPIENT, *BULK_RECIPIENTS]:
        opt_ins.record(alice.project, phone, "checkout")
    return alice_instance


def test_a_member_force_resends_a_real_failure_and_watches_it_arrive(
    stack, simulator, alice, bob, failing_recipient, browser_page
):
    page = browser_page
    # given: a message that really failed (the simulator says the number is not on WhatsApp)
    message_id = send(stack, alice, RECIPIENT)
    entry = dead_letter_of(message_id)
    assert entry.reason == "INVALID_RECIPIENT"
    opt_ins.record(alice.project, "+5511988880009", "checkout")
    send(stack, alice, "+5511988880009")  # some traffic that goes through, for the overview

    # when: bob logs in and finds it
    log_in(page, stack, "bob", "bob-password-123")
    assert page.get_by_role("heading", name="Overview").is_visible()
    page.get_by_role("heading", name="Open dead letters").wait_for()
    screenshot(page, "overview")

    page.get_by_role("link", name="Dead letters").first.click()
    page.get_by_role("link", name=RECIPIENT).click()
    page.get_by_role("heading", name=f"Message to {RECIPIENT}").wait_for()
    assert page.get_by_text("INVALID_RECIPIENT").first.is_visible()
    assert page.get_by_text("Number is not on WhatsApp").first.is_visible()
    screenshot(page, "dead-letter")

    # the cause is fixed (the customer corrected the number on their side / the person joined)
    simulator.faults(failing_recipient.name, not_on_whatsapp=BULK_RECIPIENTS)
    page.get_by_role("button", name="Force resend").click()

    # then: the page says so, follows the message live, and it arrives
    page.get_by_text("Resent.").wait_for()
    page.locator("#message-status").get_by_text(re.compile("Delivered|Read")).wait_for(timeout=60_000)
    screenshot(page, "dead-letter-resent")
    message = Message.objects.get(pk=message_id)
    assert message.status in ARRIVED
    resent = message.events.get(kind=EventKind.RESENT)
    assert resent.actor == "dashboard:bob"
    assert page.get_by_text("by dashboard:bob").first.is_visible()
    entry.refresh_from_db()
    assert entry.status == "RESENT" and entry.resolved_by == "dashboard:bob"
    # Evolution saw two calls for it: the refused first attempt and the resend, nothing more
    assert len(simulator.sends(instance=failing_recipient.name, number=RECIPIENT)) == 2


def test_a_bulk_resend_runs_in_the_background_with_a_progress_bar(
    stack, simulator, alice, bob, failing_recipient, maintenance_worker, browser_page
):
    page = browser_page
    ids = [send(stack, alice, to) for to in BULK_RECIPIENTS]
    for message_id in ids:
        dead_letter_of(message_id)
    simulator.faults(failing_recipient.name, not_on_whatsapp=[])

    log_in(page, stack, "bob", "bob-password-123")
    page.goto(f"{stack.web_url}/dashboard/p/{alice.project.pk}/dead-letters/?status=OPEN&reason=INVALID_RECIPIENT")
    screenshot(page, "dead-letters")
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name=re.compile(r"Resend all 3 matching")).click()

    page.get_by_role("heading", name=re.compile(r"Bulk resend #\d+")).wait_for()
    page.locator("#bulk-status").get_by_text("Done").wait_for(timeout=60_000)
    assert page.locator("#bulk-resent").inner_text() == "3"
    assert page.get_by_role("progressbar").get_attribute("aria-valuenow") == "100"
    screenshot(page, "bulk-resend")

    for message_id in ids:
        wait_until(lambda: Message.objects.get(pk=message_id).status in ARRIVED, timeout=60,
                   message=f"{message_id} delivered")
        assert Message.objects.get(pk=message_id).events.get(kind=EventKind.RESENT).actor == "dashboard:bob"


def test_another_projects_member_gets_404(stack, simulator, alice, carol, failing_recipient, browser_page):
    page = browser_page
    entry = dead_letter_of(send(stack, alice, RECIPIENT))
    operators.create_member(carol.project.pk, "dave", "dave-password-123")

    log_in(page, stack, "dave", "dave-password-123")
    for path in (f"/dashboard/p/{alice.project.pk}/", f"/dashboard/p/{alice.project.pk}/dead-letters/",
                 f"/dashboard/p/{alice.project.pk}/dead-letters/{entry.pk}/"):
        response = page.goto(f"{stack.web_url}{path}")
        assert response.status == 404, path
        assert page.get_by_role("heading", name="Not found").is_visible()
    screenshot(page, "not-found")
    # and his own project's overview shows none of alice's data
    page.goto(f"{stack.web_url}/dashboard/")
    assert RECIPIENT not in page.content()


def test_a_member_corrects_the_number_and_resends(stack, simulator, alice, bob, failing_recipient, browser_page):
    """Issue 23 §2: a customer's "the destination number was wrong, fixed, then Force Resend"."""
    page = browser_page
    corrected = "+5511977776666"
    message_id = send(stack, alice, RECIPIENT)
    entry = dead_letter_of(message_id)
    log_in(page, stack, "bob", "bob-password-123")
    page.goto(f"{stack.web_url}/dashboard/p/{alice.project.pk}/dead-letters/{entry.pk}/")

    # a corrected number without an opt-in: the funnel refuses, nothing changes
    page.locator("#resend-to").fill(corrected)
    page.get_by_role("button", name="Force resend").click()
    page.get_by_text("opt_in_required").wait_for()
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"

    # the customer records the consent, corrects the number again and resends
    opt_ins.record(alice.project, corrected, "support call")
    page.locator("#resend-to").fill("+55 11 97777-6666")
    page.get_by_role("button", name="Force resend").click()

    page.get_by_text("Resent.").wait_for()
    page.locator("#message-status").get_by_text(re.compile("Delivered|Read")).wait_for(timeout=60_000)
    page.get_by_text(re.compile(r"corrected to: .*→")).first.wait_for()
    screenshot(page, "dead-letter-corrected")
    message = Message.objects.get(pk=message_id)
    assert message.to == corrected and message.status in ARRIVED
    line = message.events.get(kind=EventKind.RESENT)
    assert line.actor == "dashboard:bob" and line.detail["corrected"]["to"] == {"old": RECIPIENT, "new": corrected}
    assert [s["number"] for s in simulator.sends(instance=failing_recipient.name)][-1] == corrected.lstrip("+")
