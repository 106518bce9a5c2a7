"""A dead letter resent with a corrected `to` and/or `instance` (issue 23 §2): the corrected request runs
the whole funnel again, a refusal changes nothing, and the timeline records old → new and who did it."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from messaging import opt_ins, resend
from messaging.errors import Rejected
from messaging.models import DeadLetter, EventKind, Message, OutboxEntry, Status
from tests.conftest import add_instance
from tests.messaging.test_resend import RECIPIENT, failed_message
from tests.support.simulator import wait_until

CORRECTED = "+5511977776666"


@pytest.fixture
def opted_in(alice):
    opt_ins.record(alice.project, RECIPIENT, "checkout")


@pytest.fixture
def entry(alice, alice_instance, opted_in) -> DeadLetter:
    return failed_message(alice)


def unchanged(entry: DeadLetter) -> None:
    """The refusal changed nothing: the entry is open, the message failed to its old recipient, no outbox row."""
    entry.refresh_from_db()
    message = Message.objects.get(pk=entry.message_id)
    assert entry.status == "OPEN" and entry.resolved_by == ""
    assert message.status == Status.FAILED and message.to == RECIPIENT
    assert not OutboxEntry.objects.filter(message=message).exists()
    assert not message.events.filter(kind=EventKind.RESENT).exists()


def test_a_corrected_recipient_is_resent_and_the_timeline_shows_old_to_new(alice, entry):
    opt_ins.record(alice.project, CORRECTED, "support call")

    done = resend.force_resend(entry, "dashboard:bob", correction=resend.Correction(to=CORRECTED))

    assert done.outcome == resend.RESENT
    message = Message.objects.get(pk=entry.message_id)
    assert message.status == Status.QUEUED and message.to == CORRECTED
    line = message.events.get(kind=EventKind.RESENT)
    assert line.actor == "dashboard:bob"
    assert line.detail["corrected"] == {"to": {"old": RECIPIENT, "new": CORRECTED}}


def test_the_corrected_recipient_needs_its_own_opt_in(alice, entry):
    # RECIPIENT is opted in, CORRECTED is not: the funnel judges the corrected request.
    with pytest.raises(Rejected) as refused:
        resend.force_resend(entry, "dashboard:bob", correction=resend.Correction(to=CORRECTED))

    assert refused.value.status == 422 and refused.value.code == "opt_in_required"
    unchanged(entry)


def test_a_corrected_instance_must_be_the_projects_and_is_recorded(alice, carol, entry):
    add_instance(carol.project, "carol-main")
    with pytest.raises(Rejected) as refused:
        resend.force_resend(entry, "api:x", correction=resend.Correction(instance="carol-main"))
    assert refused.value.code == "unknown_instance"
    unchanged(entry)

    second = add_instance(alice.project, "alice-second", priority=20)
    resend.force_resend(entry, "api:x", correction=resend.Correction(instance=second.name))

    message = Message.objects.get(pk=entry.message_id)
    assert message.instance_id == second.pk and message.requested_instance == second.name
    assert message.events.get(kind=EventKind.RESENT).detail["corrected"] == {
        "instance": {"old": None, "new": "alice-second"}
    }


def test_in_test_the_corrected_recipient_must_be_the_test_number(alice, alice_instance):
    opt_ins.record(alice.project, alice.project.test_number, "me")
    body_entry = failed_message(alice, to=alice.project.test_number)
    Message.objects.filter(pk=body_entry.message_id).update(environment="TEST")

    with pytest.raises(Rejected) as refused:
        resend.force_resend(body_entry, "api:x", correction=resend.Correction(to=CORRECTED))

    assert refused.value.status == 403 and refused.value.code == "test_recipient_not_allowed"
    assert DeadLetter.objects.get(pk=body_entry.pk).status == "OPEN"


def test_a_correction_equal_to_the_message_records_none(entry):
    resend.force_resend(entry, "api:x", correction=resend.Correction(to=RECIPIENT))

    assert "corrected" not in Message.objects.get(pk=entry.message_id).events.get(kind=EventKind.RESENT).detail


def test_a_typed_correction_is_checked_before_anything(entry):
    with pytest.raises(Rejected) as refused:
        resend.check_correction("call me", "x" * 101)
    assert refused.value.status == 400
    assert set(refused.value.details["fields"]) == {"to", "instance"}
    assert resend.check_correction(" +55 11 97777-6666 ", "  ") == resend.Correction(to=CORRECTED, instance=None)


# ---- the API --------------------------------------------------------------------------------

def api(alice) -> APIClient:
    return alice.client(live=True)


def test_the_api_resends_with_a_corrected_to(alice, entry):
    opt_ins.record(alice.project, CORRECTED, "support call")

    response = api(alice).post(f"/v1/dead-letters/{entry.pk}/resend", {"to": "+55 (11) 97777-6666"}, format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["outcome"] == "resent" and body["message"]["to"] == CORRECTED
    line = Message.objects.get(pk=entry.message_id).events.get(kind=EventKind.RESENT)
    assert line.actor.startswith("api:ps_live_")
    assert line.detail["corrected"]["to"] == {"old": RECIPIENT, "new": CORRECTED}


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"to": CORRECTED}, 422, "opt_in_required"),
        ({"instance": "nobody-s"}, 422, "unknown_instance"),
        ({"to": "not a number"}, 400, "invalid_request"),
        ({"to": 5511977776666}, 400, "invalid_request"),
        ({"instance": "a\x00b"}, 400, "invalid_request"),
        ({"instance": "x" * 101}, 400, "invalid_request"),
    ],
)
def test_the_api_answers_the_funnels_error_and_changes_nothing(alice, entry, body, status, code):
    response = api(alice).post(f"/v1/dead-letters/{entry.pk}/resend", body, format="json")

    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == code
    unchanged(entry)


# ---- the dashboard --------------------------------------------------------------------------

def test_the_dashboard_form_resends_with_a_correction(bob, alice, entry):
    opt_ins.record(alice.project, CORRECTED, "support call")
    client = Client()
    client.force_login(bob)
    detail = f"/dashboard/p/{alice.project.pk}/dead-letters/{entry.pk}/"
    assert b'id="resend-to"' in client.get(detail).content

    response = client.post(detail + "resend", {"to": "+55 11 97777-6666", "instance": ""}, follow=True)

    assert b"Resent." in response.content
    message = Message.objects.get(pk=entry.message_id)
    assert message.to == CORRECTED
    assert message.events.get(kind=EventKind.RESENT).actor == "dashboard:bob"
    page = client.get(detail).content.decode()
    assert "corrected" in page and RECIPIENT in page and CORRECTED in page


def test_the_dashboard_shows_a_refused_correction_and_changes_nothing(bob, alice, entry):
    client = Client()
    client.force_login(bob)
    detail = f"/dashboard/p/{alice.project.pk}/dead-letters/{entry.pk}/"

    refused = client.post(detail + "resend", {"to": CORRECTED}, follow=True)
    assert b"opt_in_required" in refused.content
    invalid = client.post(detail + "resend", {"to": "ext 12"}, follow=True)
    assert b"invalid_request" in invalid.content
    unchanged(entry)


# ---- the real stack -------------------------------------------------------------------------

def test_a_wrong_number_fixed_then_resent_is_delivered(stack, simulator, alice, alice_instance):
    """A customer's correction on real parts: a number not on WhatsApp fails INVALID_RECIPIENT, the customer
    fixes it through the API, and the same message reaches the corrected number."""
    import requests

    simulator.register(alice_instance, stack.webhook_url)
    simulator.faults(alice_instance.name, not_on_whatsapp=[RECIPIENT.lstrip("+")])
    opt_ins.record(alice.project, RECIPIENT, "checkout")
    opt_ins.record(alice.project, CORRECTED, "support call")
    headers = {"Authorization": f"Bearer {alice.live_key}"}  # timeouts of 30 s: a cold web worker on a loaded host is slow to answer first
    sent = requests.post(f"{stack.web_url}/v1/messages/send", headers=headers, timeout=30,
                         json={"to": RECIPIENT, "category": "UTILITY", "text": "Your order shipped"})
    assert sent.status_code == 202, sent.text
    message_id = sent.json()["id"]
    entry = wait_until(lambda: DeadLetter.objects.filter(message_id=message_id).first(), timeout=20,
                       message="the dead letter")
    assert entry.reason == "INVALID_RECIPIENT"

    answer = requests.post(f"{stack.web_url}/v1/dead-letters/{entry.pk}/resend", headers=headers, timeout=30,
                           json={"to": CORRECTED})

    assert answer.status_code == 200, answer.text
    wait_until(lambda: Message.objects.filter(pk=message_id, status="READ").exists(), timeout=20, message="READ")
    sends = simulator.sends(instance=alice_instance.name)
    assert [s["number"] for s in sends][-1:] == [CORRECTED.lstrip("+")]
    kinds = list(Message.objects.get(pk=message_id).events.values_list("kind", flat=True))
    assert kinds.count("RESENT") == 1 and kinds.index("DEAD_LETTERED") < kinds.index("RESENT")
